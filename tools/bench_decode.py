"""Benchmark decode_attention on the GPU: split count 1, the heuristic, and the sweep's best.

Every decode shape of ../shared/BENCHMARKING.md (bf16, 16-token pages). Each config is
checked against the fp32 reference before it is timed; times are per-call medians of
CUDA-graph replays (triton.testing.do_bench), each graph holding enough calls to last about
1 ms (so a replay's launch latency is spread as in a serving step) and rotating among input
sets when the working set is under 4x L2. The heuristic is also timed one call per graph
(the method of sessions 1-4), reported as ``us_one_call_per_graph``. The HBM read ceiling
is measured in the same run with a streaming-read Triton kernel over 4 GiB.

Usage (on the device)::

    python tools/bench_decode.py --out $OUT/decode.json            # everything
    python tools/bench_decode.py --shapes kimi --max-cands 12      # a subset, short sweep
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdispatch.device import Device  # noqa: E402
from kdispatch.kernels.decode_attention import (  # noqa: E402
    SPEC, launch_decode_attention, reference_decode_attention,
)

L2_BYTES = 60 << 20


@dataclass
class Shape:
    name: str
    batch: int
    hq: int
    hk: int
    dk: int
    dv: int
    context: int

    @property
    def latent(self) -> bool:
        return self.hk == 1 and self.dv < self.dk


def shapes() -> list[Shape]:
    out = []
    for b in (1, 8, 64):
        for ctx in (8192, 32768, 131072):
            out.append(Shape(f"llama3-8b-gqa-b{b}-c{ctx}", b, 32, 8, 128, 128, ctx))
    out.append(Shape("llama3-8b-gqa-long-b4-c262144", 4, 32, 8, 128, 128, 262144))
    for b in (1, 8):
        for ctx in (65536, 327600):
            out.append(Shape(f"kimi-k3-mla-b{b}-c{ctx}", b, 12, 1, 576, 512, ctx))
    for b in (8, 32):
        for ctx in (16384, 327600):
            out.append(Shape(f"deepseek-v3-tp8-mla-b{b}-c{ctx}", b, 16, 1, 576, 512, ctx))
    out.append(Shape("deepseek-v3-tp1-mla-b32-c16384", 32, 128, 1, 576, 512, 16384))
    for b in (1, 8):
        out.append(Shape(f"ouro-1.4b-mha-b{b}-c4096", b, 16, 16, 128, 128, 4096))
    # the target shapes first, so a time limit drops the others
    first = ("kimi-k3-mla-b8-c327600", "deepseek-v3-tp8-mla-b32-c16384",
             "llama3-8b-gqa-long-b4-c262144", "llama3-8b-gqa-b8-c32768",
             "llama3-8b-gqa-b64-c8192", "deepseek-v3-tp1-mla-b32-c16384")
    return sorted(out, key=lambda s: first.index(s.name) if s.name in first else len(first))


@triton.jit
def _read_kernel(X, OUT, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(OUT + pid * BLOCK + tl.arange(0, BLOCK), acc)


def read_ceiling(sms: int) -> dict:
    n = (4 << 30) // 4
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    best = None
    for per_sm in (8, 16):
        grid = sms * per_sm
        out = torch.empty(grid * 1024, device="cuda")
        fn = lambda: _read_kernel[(grid,)](x, out, n, BLOCK=1024, num_warps=4)  # noqa: E731
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        gbs = n * 4 / ms / 1e6
        if best is None or gbs > best["gbs"]:
            best = {"gbs": gbs, "ms": ms, "programs_per_sm": per_sm}
    ref = x.view(-1, 1024).sum(0)
    got = out.view(-1, 1024).sum(0)
    assert torch.allclose(ref, got, rtol=1e-3, atol=1e-1), "read kernel wrong"
    del x
    torch.cuda.empty_cache()
    return best


def make_sets(s: Shape, nsets: int, seed: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    page = 16
    pages = -(-s.context // page)
    sets = []
    for i in range(nsets):
        nb = s.batch * pages + 1
        q = torch.randn(s.batch, s.hq, s.dk, device="cuda", generator=g).bfloat16()
        k = torch.empty(nb, page, s.hk, s.dk, device="cuda", dtype=torch.bfloat16)
        k.normal_(generator=g)
        v = k[..., :s.dv] if s.latent else torch.randn(
            nb, page, s.hk, s.dv, device="cuda", generator=g).bfloat16()
        bt = torch.randperm(nb, device="cuda", generator=g)[:s.batch * pages]
        bt = bt.view(s.batch, pages).to(torch.int32)
        sl = torch.full((s.batch,), s.context, dtype=torch.int32, device="cuda")
        sets.append(dict(q=q, k_cache=k, v_cache=v, block_table=bt, seq_lens=sl,
                         scale=s.dk ** -0.5))
    return sets


def live_bytes(s: Shape) -> int:
    per_tok = s.hk * (s.dk if s.latent else s.dk + s.dv) * 2
    return s.batch * s.context * per_tok + s.batch * s.hq * (s.dk + s.dv) * 2


#: the rows of each shape: split count 1, the heuristic, its twins (the reduce launched
#: early; the other way to merge the splits), and the best config timed
LABELS = ("splits=1", "heuristic", "heuristic-pdl", "heuristic-merge-twin", "sweep-best")
#: a timed graph holds enough calls to last about this long, so a replay's own launch
#: latency (several us) is spread thin, as in a serving step's graph of many kernels
GRAPH_US = 1000.0
MAX_CALLS = 32


def _graph_of(fns, calls: int):
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fns[i % len(fns)]()
    torch.cuda.synchronize()
    return graph


def time_fns(fns, calls: int | None = None) -> tuple[float, float, float]:
    """Per-call median and 20th/80th percentiles (us) of do_bench'd graph replays.

    The graph cycles through ``fns`` (one per input set); it holds ``calls`` calls, by
    default as many as last about GRAPH_US (at least one per function, at most MAX_CALLS).
    ``calls=1`` with one function times a replay of a single call, launch latency included.
    """
    for f in fns:  # compile + warm
        f()
    torch.cuda.synchronize()
    n = calls or len(fns)
    graph = _graph_of(fns, n)
    med = triton.testing.do_bench(graph.replay, warmup=5, rep=20, return_mode="median")
    if calls is None:
        want = min(MAX_CALLS, max(len(fns), math.ceil(GRAPH_US / (med * 1e3 / n))))
        if want > n:
            del graph
            n = want
            graph = _graph_of(fns, n)
    q20, med, q80 = triton.testing.do_bench(graph.replay, warmup=10, rep=40,
                                            quantiles=[0.2, 0.5, 0.8])
    return med * 1e3 / n, q20 * 1e3 / n, q80 * 1e3 / n


def time_config(cfg, sets, calls: int | None = None) -> tuple[float, float, float]:
    """:func:`time_fns` of ``cfg`` launched on each input set of ``sets``."""
    return time_fns([lambda inp=inp: launch_decode_attention(cfg, **inp) for inp in sets],
                    calls)


@dataclass
class Row:
    shape: str
    label: str
    config: dict
    us: float
    us_q20: float
    us_q80: float
    gbs: float
    pct_ceiling: float
    max_err: float
    tflops: float | None = None
    extra: dict = field(default_factory=dict)


def bench_shape(s: Shape, ceiling: float, max_cands: int, dev: Device) -> list[Row]:
    ws = live_bytes(s)
    nsets = max(1, min(8, math.ceil(4 * L2_BYTES / ws)))
    sets = make_sets(s, nsets, seed=hash(s.name) % 1000)
    key = SPEC.key(dev, sets[0])
    ref = reference_decode_attention(**sets[0])
    atol, rtol = SPEC.tolerance(key)
    heur = SPEC.heuristic(key)
    base = SPEC.baseline(key)
    cands = list(SPEC.candidates(key))[:max_cands]
    early = heur.model_copy(update={"pdl": True, "merge": False})  # reduce launched early
    early = early if SPEC.is_valid(key, early) else heur
    twin = heur.model_copy(update={"merge": not heur.merge, "pdl": False})  # other merge way
    twin = twin if SPEC.is_valid(key, twin) else heur
    for must in (heur, base, early, twin):
        if must not in cands:
            cands.append(must)
    nbytes = live_bytes(s)
    flops = 2 * s.batch * s.hq * s.context * (s.dk + s.dv)
    results = {}
    for cfg in cands:
        try:
            out = launch_decode_attention(cfg, **sets[0])
            torch.cuda.synchronize()
        except (triton.runtime.errors.OutOfResources, RuntimeError) as exc:  # infeasible
            results[cfg] = ("infeasible", str(exc).splitlines()[0][:120])
            continue
        err = (out.float() - ref).abs().max().item()
        if not torch.allclose(out.float(), ref, atol=atol, rtol=rtol):
            results[cfg] = ("wrong", err)
            continue
        us, q20, q80 = time_config(cfg, sets)
        results[cfg] = ("ok", (us, q20, q80, err))
    rows = []
    ok = {c: r[1] for c, r in results.items() if r[0] == "ok"}
    best = min(ok, key=lambda c: ok[c][0]) if ok else None
    for label, cfg in zip(LABELS, (base, heur, early, twin, best)):
        if cfg is None or cfg not in ok:
            status = results.get(cfg, ("missing",))[0] if cfg is not None else "none"
            rows.append(Row(s.name, label, cfg.model_dump() if cfg else {}, float("nan"),
                            float("nan"), float("nan"), 0.0, 0.0, float("nan"),
                            extra={"status": status}))
            continue
        us, q20, q80, err = ok[cfg]
        gbs = nbytes / us / 1e3
        rows.append(Row(s.name, label, cfg.model_dump(), us, q20, q80, gbs,
                        100 * gbs / ceiling, err,
                        tflops=flops / us / 1e6 if s.hq >= 64 else None))
    if heur in ok:  # the previous method: one call per graph replay (launch latency in)
        row = next(r for r in rows if r.label == "heuristic")
        row.extra["us_one_call_per_graph"] = time_config(heur, sets[:1], calls=1)[0]
    bad = {str(c.model_dump()): r for c, r in results.items() if r[0] != "ok"}
    rows[-1].extra = {"candidates": len(cands), "timed": len(ok), "rejected": bad,
                      "all": {json.dumps(c.model_dump()): v[0] for c, v in ok.items()}}
    del sets
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="comma-separated name substrings")
    ap.add_argument("--max-cands", type=int, default=60, help="candidates swept per shape")
    ap.add_argument("--out", default="decode.json")
    ap.add_argument("--time-limit", type=float, default=1e9, help="stop starting shapes after s")
    args = ap.parse_args()
    t0 = time.time()
    dev = Device.from_torch("cuda")
    ceiling = read_ceiling(dev.cu_count)
    print(f"read ceiling {ceiling['gbs']:.0f} GB/s", flush=True)
    wanted = [w for w in args.shapes.split(",") if w]
    todo = [s for s in shapes() if not wanted or any(w in s.name for w in wanted)]
    rows: list[Row] = []
    skipped = []
    for s in todo:
        if time.time() - t0 > args.time_limit:
            skipped.append(s.name)
            continue
        ts = time.time()
        new = bench_shape(s, ceiling["gbs"], args.max_cands, dev)
        rows += new
        for r in new:
            print(f"{r.shape:36s} {r.label:10s} {r.us:9.1f} us {r.pct_ceiling:5.1f}% "
                  f"{json.dumps(r.config)}", flush=True)
        print(f"  ({time.time() - ts:.0f}s)", flush=True)
        write(args.out, dev, ceiling, skipped, rows)
    write(args.out, dev, ceiling, skipped, rows)
    print(f"\nread ceiling {ceiling['gbs']:.0f} GB/s; skipped: {skipped}")
    table(rows)


def write(path, dev, ceiling, skipped, rows) -> None:
    result = {"device": dev.model_dump(), "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(),
              "command": " ".join(sys.argv), "read_ceiling": ceiling, "skipped": skipped,
              "rows": [asdict(r) for r in rows]}
    Path(path).write_text(json.dumps(result, indent=1, default=str))


def table(rows) -> None:
    print(f"{'shape':36s} {'split1':>14s} {'heuristic':>14s} {'with pdl':>14s} "
          f"{'merge twin':>14s} {'best':>14s} {'h/best':>6s} {'h 1/graph':>9s}")
    by = {}
    for r in rows:
        by.setdefault(r.shape, {})[r.label] = r
    for name, d in by.items():
        cells = [f"{d[k].us:7.1f}us {d[k].pct_ceiling:4.0f}%" for k in LABELS]
        ratio = d["heuristic"].us / d["sweep-best"].us
        one = d["heuristic"].extra.get("us_one_call_per_graph", float("nan"))
        tf = f" {d['sweep-best'].tflops:.0f}TF" if d["sweep-best"].tflops else ""
        print(f"{name:36s} " + " ".join(f"{c:>14s}" for c in cells)
              + f" {ratio:6.2f} {one:8.1f}u{tf}")


if __name__ == "__main__":
    main()
