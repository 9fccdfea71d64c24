#!/usr/bin/env python
"""Benchmark the paged KV-cache writer (op ``kv_write``) on a GPU.

Per ../shared/BENCHMARKING.md ("KV-write shapes"):

- Ouro-1.4B-like decode: 96 layer-steps per token (24 layers x 4 loops), 16 kv heads x 128,
  bf16, 16-token pages, 368 pages per layer-step cache, K and V as strided views of one qkv
  projection; tokens 1, 8, 64. All 96 writes are captured in one CUDA graph and replayed:
  the indexed baseline (two torch indexed assignments) vs the fused writer (heuristic
  config), in microseconds per layer-step, and their ratio.
- Bulk: one 16,384-token write, in GB/s (bytes read + written) and as a share of the
  device-to-device copy bandwidth measured in the same run (a large torch copy, bytes read
  + written).
- Both with bf16 caches and with fp8 caches (``--kv``; float8_e4m3fn, per-layer-step scale
  tensors: the writer quantizes): the last table sets the fp8 fused writer against the
  bf16 one of the same run (the issue's target: the 96-write graph within 10%).

Every variant is checked against the fp32 reference before its time is reported. Times are
the median (and p20/p80) of many graph replays timed with CUDA events. Full results go to
``$OUT/kv_write.json`` (or ``--out``); a short table is printed last.

Usage::

    python tools/bench_kv_write.py                 # the protocol above
    python tools/bench_kv_write.py --sweep         # plus a timed sweep of fused configs
    python tools/bench_kv_write.py --kv fp8        # fp8 caches only
    python tools/bench_kv_write.py --kv bf16,fp8,fp8-unscaled   # + fp8 without scales
    TRITON_INTERPRET=1 python tools/bench_kv_write.py --smoke   # tiny CPU run of the code
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import triton  # noqa: E402

import kdispatch  # noqa: E402
from kdispatch.kernels._common import quantize_fp8  # noqa: E402
from kdispatch.kernels.kv_write import OP  # noqa: E402
from kdispatch.kernels.kv_write import (  # noqa: E402
    KVWriteConfig,
    reference_kv_write,
)

SPEC = OP.tuning
FP8 = torch.float8_e4m3fn


class Shape:
    def __init__(self, smoke: bool, kv: str = "bf16"):
        self.steps = 4 if smoke else 96
        self.heads = 2 if smoke else 16
        self.dim = 32 if smoke else 128
        self.page = 4 if smoke else 16
        self.pages = 24 if smoke else 368
        self.tokens = (1, 8) if smoke else (1, 8, 64)
        self.bulk_tokens = 64 if smoke else 16384
        self.bulk_sets = 2 if smoke else 4  # rotate: 4 x 256 MB moved >> 60 MB L2
        self.copy_bytes = 1 << 20 if smoke else 2 << 30
        self.dtype = torch.bfloat16
        self.kv = kv  # "bf16", "fp8" or "fp8-unscaled" (no scales: the conversion alone)
        self.cache_dtype = FP8 if kv.startswith("fp8") else torch.bfloat16


# -- timing -----------------------------------------------------------------------------------
def summarize(times_us: list[float]) -> dict[str, float]:
    q = statistics.quantiles(times_us, n=10, method="inclusive")
    return {"median_us": statistics.median(times_us), "p20_us": q[1], "p80_us": q[7],
            "n": len(times_us)}


def time_calls(fn: Callable[[], Any], n: int, warmup: int, device: torch.device
               ) -> dict[str, float]:
    """Median/p20/p80 of ``n`` calls of ``fn`` (a graph replay), each timed with CUDA events.

    Calls are queued in batches behind a GPU sleep, so the host is ahead and the events
    measure back-to-back GPU execution, not launch latency.
    """
    if device.type != "cuda":  # --smoke: interpreter, wall clock
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return summarize(times)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times: list[float] = []
    batch = 25
    while len(times) < n:
        k = min(batch, n - len(times))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        torch.cuda._sleep(2_000_000)  # ~1 ms: lets the host queue the batch
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times += [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return summarize(times)


def capture(fn: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """A CUDA graph of ``fn`` (warmed up on a side stream first); on CPU, ``fn`` itself."""
    if device.type != "cuda":
        fn()
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# -- inputs -----------------------------------------------------------------------------------
def rand_(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill in place with values in +-[0.25, 1.25]: random, never zero."""
    for chunk in t.view(-1).split(1 << 26):
        x = torch.rand(chunk.shape, generator=gen, device=t.device) * 2 - 1
        chunk.copy_(x + torch.where(x >= 0, 0.25, -0.25))
    return t


class Step:
    """One layer-step: its qkv projection, K/V views, its own cache pair and slots."""

    def __init__(self, sh: Shape, tokens: int, pages: int, kc: torch.Tensor, vc: torch.Tensor,
                 gen: torch.Generator, device: torch.device):
        hd = sh.heads * sh.dim
        self.qkv = rand_(torch.empty(tokens, 3 * hd, dtype=sh.dtype, device=device), gen)
        self.key = self.qkv[:, hd:2 * hd].view(tokens, sh.heads, sh.dim)
        self.value = self.qkv[:, 2 * hd:].view(tokens, sh.heads, sh.dim)
        self.key_cache, self.value_cache = kc, vc
        self.slot_mapping = torch.randperm(pages * sh.page, generator=gen,
                                           device=device)[:tokens].contiguous()
        self.scales = {}
        self.unit = torch.ones(1, device=device) if kc.dtype == FP8 else None
        if sh.kv == "fp8":  # a layer's own scales, as an engine keeps them
            self.scales = {"k_scale": torch.full((1,), 0.01, device=device),
                           "v_scale": torch.full((1,), 0.02, device=device)}

    def args(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "key_cache": self.key_cache,
                "value_cache": self.value_cache, "slot_mapping": self.slot_mapping,
                **self.scales}

    def stored(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """What the cache should hold for rows ``x`` (quantized into an fp8 cache)."""
        if self.unit is None:
            return x
        return quantize_fp8(x, self.scales.get(name, self.unit), FP8)


def check_steps(steps: list[Step], replay: Callable[[], None], gen: torch.Generator,
                device: torch.device, full: tuple[int, ...]) -> str | None:
    """New random K/V, one replay, then compare: whole pools for ``full`` steps, the
    written rows for every step. Returns an error message or None."""
    for st in steps:
        rand_(st.qkv, gen)
    refs = {i: reference_kv_write(**steps[i].args()) for i in full}
    replay()
    sync(device)
    for i, (ref_k, ref_v) in refs.items():
        if not (torch.equal(steps[i].key_cache.float(), ref_k)
                and torch.equal(steps[i].value_cache.float(), ref_v)):
            return f"layer-step {i}: pools differ from the reference"
    for i, st in enumerate(steps):
        page = st.key_cache.shape[1]
        blk, off = st.slot_mapping // page, st.slot_mapping % page
        if not (torch.equal(st.key_cache[blk, off].float(), st.stored(st.key, "k_scale").float())
                and torch.equal(st.value_cache[blk, off].float(),
                                st.stored(st.value, "v_scale").float())):
            return f"layer-step {i}: written rows differ from key/value"
    return None


def graph_of(steps: list[Step], cfg: KVWriteConfig, device: torch.device) -> Callable[[], None]:
    def run_all() -> None:
        for st in steps:
            kdispatch.write_kv(**st.args(), config=cfg)
    return capture(run_all, device)


def measure(steps: list[Step], cfg: KVWriteConfig, gen: torch.Generator, device: torch.device,
            args: argparse.Namespace, full: tuple[int, ...], replays: int) -> dict[str, Any]:
    replay = graph_of(steps, cfg, device)
    err = check_steps(steps, replay, gen, device, full)
    out: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "correct": err is None}
    if err is not None:
        out["error"] = err
        return out
    t = time_calls(replay, replays, args.warmup, device)
    n = len(steps)
    out.update(t)
    out.update({f"{k}_per_write": t[k] / n for k in ("median_us", "p20_us", "p80_us")})
    return out


# -- benchmarks -------------------------------------------------------------------------------
def bench_copy(sh: Shape, gen: torch.Generator, device: torch.device,
               args: argparse.Namespace) -> dict[str, Any]:
    n = sh.copy_bytes // 2
    src = rand_(torch.empty(n, dtype=torch.bfloat16, device=device), gen)
    dst = torch.empty_like(src)
    t = time_calls(lambda: dst.copy_(src), args.replays // 2, args.warmup, device)
    if not torch.equal(dst, src):
        raise RuntimeError("copy ceiling: destination differs from source")
    moved = 2 * sh.copy_bytes
    return {**t, "bytes": moved, "gbps": moved / (t["median_us"] * 1e3)}


def ouro_steps(sh: Shape, tokens: int, pools: list[tuple[torch.Tensor, torch.Tensor]],
               gen: torch.Generator, device: torch.device) -> list[Step]:
    return [Step(sh, tokens, sh.pages, kc, vc, gen, device) for kc, vc in pools]


def bench_ouro(sh: Shape, tokens: int, pools, gen, device, args) -> dict[str, Any]:
    steps = ouro_steps(sh, tokens, pools, gen, device)
    key = OP.key(kdispatch.Device.current() if device.type == "cuda"
                   else kdispatch.Device.interpreter(), steps[0].args())
    exp = kdispatch.explain("kv_write", **steps[0].args())
    full = (0, len(steps) // 2, len(steps) - 1)
    res: dict[str, Any] = {"tokens": tokens, "kv": sh.kv, "layer_steps": len(steps),
                           "key": key.model_dump(mode="json"), "provenance": exp.provenance}
    res["indexed"] = measure(steps, SPEC.baseline(key), gen, device, args, full, args.replays)
    res["fused"] = measure(steps, exp.config, gen, device, args, full, args.replays)
    if exp.config.pdl:  # the same tile launched plainly: what programmatic launch adds
        res["fused_no_pdl"] = measure(steps, exp.config.model_copy(update={"pdl": False}),
                                      gen, device, args, full, args.replays)
    if res["indexed"]["correct"] and res["fused"]["correct"]:
        res["speedup"] = res["indexed"]["median_us"] / res["fused"]["median_us"]
    return res


def bench_bulk(sh: Shape, gen, device, args, copy_gbps: float) -> dict[str, Any]:
    t = sh.bulk_tokens
    pages = triton.cdiv(2 * t, sh.page)
    steps = []
    for _ in range(sh.bulk_sets):
        kc = rand_(torch.empty(pages, sh.page, sh.heads, sh.dim, dtype=sh.cache_dtype,
                               device=device), gen)
        vc = rand_(torch.empty_like(kc), gen)
        steps.append(Step(sh, t, pages, kc, vc, gen, device))
    key = OP.key(kdispatch.Device.current() if device.type == "cuda"
                   else kdispatch.Device.interpreter(), steps[0].args())
    exp = kdispatch.explain("kv_write", **steps[0].args())
    moved = SPEC.bytes_moved(key)
    res: dict[str, Any] = {"tokens": t, "kv": sh.kv, "sets": len(steps),
                           "key": key.model_dump(mode="json"),
                           "provenance": exp.provenance, "bytes_per_write": moved}
    full = tuple(range(len(steps)))
    replays = max(10, args.replays // 4)
    variants = [("indexed", SPEC.baseline(key)), ("fused", exp.config)]
    if exp.config.pdl:
        variants.append(("fused_no_pdl", exp.config.model_copy(update={"pdl": False})))
    for name, cfg in variants:
        m = measure(steps, cfg, gen, device, args, full, replays)
        if m["correct"]:
            m["gbps"] = moved / (m["median_us_per_write"] * 1e3)
            m["pct_of_copy"] = 100.0 * m["gbps"] / copy_gbps
        res[name] = m
    return res, steps


def sweep_configs(key, tokens: int) -> list[KVWriteConfig]:
    if tokens == 1:
        allowed = {"block_h": (1, 2, 4, 8, 16), "block_t": (1,), "num_warps": (1, 2, 4, 8)}
    elif tokens <= 64:
        allowed = {"block_h": (4, 8, 16), "block_t": (1, 2), "num_warps": (2, 4)}
    else:
        allowed = {"block_h": (8, 16), "block_t": (1, 2, 4), "num_warps": (4, 8)}
    return [c for c in SPEC.candidates(key)
            if all(getattr(c, f) in v for f, v in allowed.items())]


def run_sweep(sh, pools, bulk_steps, gen, device, args) -> list[dict[str, Any]]:
    """Time fused candidates (within a time budget) and report each shape's best."""
    deadline = time.monotonic() + args.sweep_budget
    out = []
    targets = [(1, ouro_steps(sh, 1, pools, gen, device)),
               (sh.tokens[-1], ouro_steps(sh, sh.tokens[-1], pools, gen, device)),
               (sh.bulk_tokens, bulk_steps)]
    for tokens, steps in targets:
        dev_model = (kdispatch.Device.current() if device.type == "cuda"
                     else kdispatch.Device.interpreter())
        key = OP.key(dev_model, steps[0].args())
        heur = OP.heuristic(key)
        rows = []
        for cfg in sweep_configs(key, tokens):
            if time.monotonic() > deadline:
                break
            m = measure(steps, cfg, gen, device, args, (0,), max(10, args.replays // 4))
            rows.append(m)
        ok = [r for r in rows if r["correct"]]
        best = min(ok, key=lambda r: r["median_us"]) if ok else None
        out.append({"kv": sh.kv, "tokens": tokens, "writes": len(steps), "tried": len(rows),
                    "heuristic": heur.model_dump(mode="json"),
                    "best": best, "incorrect": [r for r in rows if not r["correct"]],
                    "all": rows})
    return out


# -- main -------------------------------------------------------------------------------------
def fmt(m: dict[str, Any], key: str = "median_us_per_write") -> str:
    if not m.get("correct"):
        return "WRONG"
    lo, hi = m["p20_us_per_write"], m["p80_us_per_write"]
    return f"{m[key]:.3f} [{lo:.3f}-{hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON path (default $OUT/kv_write.json)")
    p.add_argument("--replays", type=int, default=200, help="timed graph replays per variant")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="also time a sweep of fused configs")
    p.add_argument("--sweep-budget", type=float, default=60.0, help="seconds for --sweep")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter ok)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv", default="bf16,fp8",
                   help="cache dtypes, comma-separated: bf16, fp8, fp8-unscaled (an fp8 cache "
                        "without scales: the conversion without the division)")
    args = p.parse_args(argv)

    out_path = Path(args.out) if args.out else (
        Path(os.environ["OUT"]) / "kv_write.json" if os.environ.get("OUT") else None)
    if out_path is None:
        p.error("set $OUT or pass --out")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        p.error("no CUDA device: only --smoke runs on the CPU interpreter")
    sh = Shape(args.smoke)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    t_start = time.monotonic()

    res: dict[str, Any] = {
        "command": "python tools/bench_kv_write.py " + " ".join(sys.argv[1:] if argv is None
                                                                  else argv),
        "device": (torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
        "device_key": (kdispatch.Device.current().key if device.type == "cuda"
                       else "cpu-interpreter"),
        "torch": torch.__version__, "triton": triton.__version__,
        "kdispatch": kdispatch.__version__, "python": platform.python_version(),
        "source_hash": OP.source_hash(),
        "shape": {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in vars(sh).items()},
    }
    res["copy"] = bench_copy(sh, gen, device, args)
    copy_gbps = res["copy"]["gbps"]

    res["ouro"], res["bulk"] = [], []
    for kv in args.kv.split(","):
        sh = Shape(args.smoke, kv)
        pools = []
        for _ in range(sh.steps):
            kc = rand_(torch.empty(sh.pages, sh.page, sh.heads, sh.dim, dtype=sh.cache_dtype,
                                   device=device), gen)
            pools.append((kc, rand_(torch.empty_like(kc), gen)))
        res["ouro"] += [bench_ouro(sh, t, pools, gen, device, args) for t in sh.tokens]
        bulk, bulk_steps = bench_bulk(sh, gen, device, args, copy_gbps)
        res["bulk"].append(bulk)
        if args.sweep:  # each cache dtype's sweep
            res.setdefault("sweep", []).extend(
                run_sweep(sh, pools, bulk_steps, gen, device, args))
        del pools, bulk_steps
    res["wall_s"] = time.monotonic() - t_start

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=2))

    variants = ("indexed", "fused", "fused_no_pdl")
    ok = all(r[v]["correct"] for r in res["ouro"] + res["bulk"] for v in variants if v in r)
    print(f"\nkv_write on {res['device']} (torch {res['torch']}, triton {res['triton']}); "
          f"copy ceiling {copy_gbps:.0f} GB/s; JSON: {out_path}")
    if args.sweep:
        for s in res["sweep"]:
            b = s["best"]
            best = (f"{b['median_us_per_write']:.3f} us {b['config']}" if b else "none")
            print(f"sweep {s['kv']} T={s['tokens']}: tried {s['tried']}, best {best}; "
                  f"heuristic {s['heuristic']}")
        best = {(s["kv"], s["tokens"]): s for s in res["sweep"] if s["best"]}
        for (kv, t), s in best.items():
            twin = best.get(("bf16", t))
            if kv != "bf16" and twin:
                print(f"{kv} / bf16 swept bests, {s['writes']} writes of {t} token(s): "
                      f"{s['best']['median_us'] / twin['best']['median_us']:.3f}x")
    print(f"{'kv':>4} {'tokens':>7} | {'indexed us/step [p20-p80]':>27} | "
          f"{'fused us/step [p20-p80]':>25} | speedup | {'fused without pdl':>25}")
    for r in res["ouro"]:
        sp = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        plain = fmt(r["fused_no_pdl"]) if "fused_no_pdl" in r else "-"
        print(f"{r['kv']:>4} {r['tokens']:>7} | {fmt(r['indexed']):>27} | {fmt(r['fused']):>25}"
              f" | {sp:>7} | {plain:>25}")
    for b in res["bulk"]:
        for v in variants:
            if v not in b:
                continue
            m = b[v]
            if m["correct"]:
                print(f"{b['kv']} bulk {b['tokens']} tokens {v:>12}: "
                      f"{m['median_us_per_write']:.1f} us, {m['gbps']:.0f} GB/s = "
                      f"{m['pct_of_copy']:.1f}% of copy")
            else:
                print(f"{b['kv']} bulk {b['tokens']} tokens {v:>12}: WRONG ({m['error']})")
    # the fp8 writer against the bf16 writer of this run (target: within 10% at 96 writes)
    bf16 = {r["tokens"]: r for r in res["ouro"] if r["kv"] == "bf16"}
    for r in res["ouro"]:
        twin = bf16.get(r["tokens"])
        if r["kv"] != "bf16" and twin and r["fused"]["correct"] and twin["fused"]["correct"]:
            ratio = r["fused"]["median_us"] / twin["fused"]["median_us"]
            print(f"{r['kv']} / bf16 fused writer, {r['layer_steps']} writes of {r['tokens']} "
                  f"token(s): {ratio:.3f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
