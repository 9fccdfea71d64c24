"""Benchmark decode_attention on the GPU: split count 1, the heuristic, and the sweep's best.

Every decode shape of ../shared/BENCHMARKING.md (bf16 queries, 16-token pages; the ragged
DeepSeek-V3 DP-attention rows, 128 heads x batch 128, use 64-token pages and lengths drawn
around a mean, up to twice the mean: ``--shapes ragged``), with a
bf16 cache, an fp8 cache (``-fp8``: float8_e4m3fn, per-tensor scales; bytes counted in
fp8) and, for MLA, two query tokens per request (``-q2``). The last table sets each fp8
row against its bf16 twin and each two-token row against its one-token twin (the issue's
targets: fp8 about 1.9x faster than bf16; MLA with two tokens <= 1.3x one token; TFLOPS
for MLA rows). Each config is checked against the fp32 reference (on the dequantized
cache for fp8) before it is timed; times are per-call medians of
CUDA-graph replays (triton.testing.do_bench), each graph holding enough calls to last about
1 ms (so a replay's launch latency is spread as in a serving step) and rotating among input
sets when the working set is under 4x L2. The heuristic is also timed one call per graph
(the method of sessions 1-4), reported as ``us_one_call_per_graph``. The HBM read ceiling
is measured in the same run with a streaming-read Triton kernel over 4 GiB.

Usage (on the device)::

    python tools/bench_decode.py --out $OUT/decode.json            # everything
    python tools/bench_decode.py --shapes kimi --max-cands 12      # a subset, short sweep
    python tools/bench_decode.py --kv fp8 --q-len 1,2 --shapes deepseek-v3-tp8-mla-b32-c16384
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdispatch.device import Device  # noqa: E402
from kdispatch.kernels._common import quantize_fp8  # noqa: E402
from kdispatch.kernels.decode_attention import (  # noqa: E402
    OP, launch_decode_attention, reference_decode_attention,
)

L2_BYTES = 60 << 20


FP8 = torch.float8_e4m3fn
#: per-tensor scale of the benchmark's fp8 caches: randn's ~4.5 sigma maximum maps near 448
FP8_SCALE = 0.01


@dataclass
class Shape:
    name: str
    batch: int
    hq: int
    hk: int
    dk: int
    dv: int
    context: int
    kv: str = "bf16"   # cache dtype: "bf16" or "fp8"
    q_len: int = 1     # query tokens per request
    page: int = 16     # tokens per page
    mean: int = 0      # ragged lengths around this mean (0: every request at full context)

    def lengths(self) -> list[int]:
        """Each request's cached tokens: the full context, or (``mean`` > 0) drawn from
        N(mean, mean / 2), at least 1 and at most the context (the hand-written kernel's
        own performance cases), seeded by the batch and mean only so every variant of a
        shape gets the same lengths."""
        if not self.mean:
            return [self.context] * self.batch
        g = torch.Generator().manual_seed(self.batch * 100003 + self.mean)
        x = torch.normal(float(self.mean), self.mean / 2, (self.batch,), generator=g)
        return x.round().clamp(1, self.context).to(torch.int64).tolist()

    @property
    def latent(self) -> bool:
        return self.hk == 1 and self.dv < self.dk

    @property
    def base(self) -> str:
        """The name of the bf16, one-token row this row is compared with."""
        return self.name.removesuffix("-fp8").removesuffix("-q2")


def length_twin(s: Shape) -> Shape:
    """``s`` with the other length profile: ragged around half the context (every request
    at most the context, so the dispatch key is the same) or every request at full
    context."""
    if s.mean:
        return replace(s, name=s.name + "-full", mean=0)
    return replace(s, name=s.name + "-rag", mean=s.context // 2)


def variants(base: list[Shape], kvs: tuple[str, ...], q_lens: tuple[int, ...]) -> list[Shape]:
    """Every base shape with each cache dtype in ``kvs``; MLA shapes also with each query
    length in ``q_lens`` (BENCHMARKING.md: fp8 rows, and 2-token rows for MLA)."""
    out = []
    for s in base:
        for q_len in q_lens:
            if q_len > 1 and not s.latent:
                continue
            for kv in kvs:
                suffix = ("-q2" if q_len == 2 else f"-q{q_len}" if q_len > 1 else "") + (
                    "-fp8" if kv == "fp8" else "")
                out.append(replace(s, name=s.name + suffix, kv=kv, q_len=q_len))
    return out


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
    for mean in (4096, 8192, 16384, 32768):  # DP attention, ragged, 64-token pages
        out.append(Shape(f"deepseek-v3-dp-ragged-b128-m{mean}", 128, 128, 1, 576, 512,
                         2 * mean, page=64, mean=mean))
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


def _cache(nb: int, page: int, hk: int, d: int, kv: str, g: torch.Generator) -> torch.Tensor:
    """A random cache: bf16 normal values, or their fp8 quantization at ``FP8_SCALE``
    (drawn and quantized in chunks, so the fp32 temporaries stay small)."""
    out = torch.empty(nb, page, hk, d, device="cuda", dtype=FP8 if kv == "fp8" else
                      torch.bfloat16)
    scale = torch.full((1,), FP8_SCALE, device="cuda")
    for chunk in out.split(max(1, (1 << 28) // (page * hk * d))):
        x = torch.randn(chunk.shape, device="cuda", generator=g)
        chunk.copy_(quantize_fp8(x, scale, FP8) if kv == "fp8" else x)
    return out


def make_sets(s: Shape, nsets: int, seed: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    page = s.page
    pages = -(-s.context // page)
    sets = []
    for i in range(nsets):
        nb = s.batch * pages + 1
        q_shape = (s.batch, s.q_len, s.hq, s.dk) if s.q_len > 1 else (s.batch, s.hq, s.dk)
        q = torch.randn(q_shape, device="cuda", generator=g).bfloat16()
        k = _cache(nb, page, s.hk, s.dk, s.kv, g)
        v = k[..., :s.dv] if s.latent else _cache(nb, page, s.hk, s.dv, s.kv, g)
        bt = torch.randperm(nb, device="cuda", generator=g)[:s.batch * pages]
        bt = bt.view(s.batch, pages).to(torch.int32)
        sl = torch.tensor(s.lengths(), dtype=torch.int32, device="cuda")
        inp = dict(q=q, k_cache=k, v_cache=v, block_table=bt, seq_lens=sl, scale=s.dk ** -0.5)
        if s.kv == "fp8":
            inp["k_scale"] = torch.full((1,), FP8_SCALE, device="cuda")
            inp["v_scale"] = torch.full((1,), FP8_SCALE, device="cuda")
        sets.append(inp)
    return sets


def live_bytes(s: Shape) -> int:
    """The live cache once in its dtype, q read and the output written once per token."""
    per_tok = s.hk * (s.dk if s.latent else s.dk + s.dv) * (1 if s.kv == "fp8" else 2)
    return sum(s.lengths()) * per_tok + s.batch * s.q_len * s.hq * (s.dk + s.dv) * 2


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


def rotation_sets(s: Shape) -> int:
    """Input sets a timed graph rotates among: enough that the working set is at least 4x
    L2 (at most 8)."""
    return max(1, min(8, math.ceil(4 * L2_BYTES / live_bytes(s))))


def bench_shape(s: Shape, ceiling: float, max_cands: int, dev: Device) -> list[Row]:
    sets = make_sets(s, rotation_sets(s), seed=hash(s.name) % 1000)
    key = OP.key(dev, sets[0])
    assert (key.q_len, key.kv_dtype == "float8_e4m3fn") == (s.q_len, s.kv == "fp8"), key
    ref = reference_decode_attention(**sets[0])
    atol, rtol = OP.tuning.tolerance(key)
    heur = OP.heuristic(key)
    base = OP.tuning.baseline(key)
    cands = list(OP.tuning.candidates(key))[:max_cands]
    early = heur.model_copy(update={"pdl": True, "merge": False})  # reduce launched early
    early = early if OP.is_valid(key, early) else heur
    twin = heur.model_copy(update={"merge": not heur.merge, "pdl": False})  # other merge way
    twin = twin if OP.is_valid(key, twin) else heur
    for must in (heur, base, early, twin):
        if must not in cands:
            cands.append(must)
    nbytes = live_bytes(s)
    flops = 2 * s.q_len * s.hq * sum(s.lengths()) * (s.dk + s.dv)
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
                        tflops=flops / us / 1e6 if s.latent else None,
                        extra={"base": s.base, "kv": s.kv, "q_len": s.q_len}))
    if heur in ok:  # the previous method: one call per graph replay (launch latency in)
        row = next(r for r in rows if r.label == "heuristic")
        row.extra["us_one_call_per_graph"] = time_config(heur, sets[:1], calls=1)[0]
    bad = {str(c.model_dump()): r for c, r in results.items() if r[0] != "ok"}
    rows[-1].extra.update({"candidates": len(cands), "timed": len(ok), "rejected": bad,
                           "all": {json.dumps(c.model_dump()): v[0] for c, v in ok.items()}})
    del sets
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="comma-separated name substrings")
    ap.add_argument("--max-cands", type=int, default=60, help="candidates swept per shape")
    ap.add_argument("--out", default="decode.json")
    ap.add_argument("--time-limit", type=float, default=1e9, help="stop starting shapes after s")
    ap.add_argument("--kv", default="bf16,fp8", help="cache dtypes: bf16, fp8 or both")
    ap.add_argument("--q-len", default="1,2", help="query tokens per request (MLA rows)")
    ap.add_argument("--twins", action="store_true",
                    help="also each shape's length twin: ragged lengths around half the "
                         "context for a full-context shape (-rag), full context for a "
                         "ragged one (-full); same candidates, so a config's cost on one "
                         "length profile can be read against the other's best")
    args = ap.parse_args()
    t0 = time.time()
    dev = Device.from_torch("cuda")
    ceiling = read_ceiling(dev.cu_count)
    print(f"read ceiling {ceiling['gbs']:.0f} GB/s", flush=True)
    wanted = [w for w in args.shapes.split(",") if w]
    base = [s for s in shapes() if not wanted or any(w in s.name for w in wanted)]
    todo = variants(base, tuple(args.kv.split(",")), tuple(int(q) for q in args.q_len.split(",")))
    if args.twins:
        todo = [t for s in todo for t in (s, length_twin(s))]
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
    pairs(rows)


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


def pairs(rows) -> None:
    """Each fp8 row against its bf16 twin (speedup, heuristic and best) and each two-token
    row against its one-token twin of the same cache dtype (time ratio, TFLOPS)."""
    by = {(r.shape, r.label): r for r in rows}
    names = {r.shape: r.extra for r in rows if r.label == "heuristic"}
    print(f"\n{'row':40s} {'vs':36s} {'heur x':>7s} {'best x':>7s} {'best %':>7s} {'TFLOPS':>7s}")
    for name, ex in names.items():
        if ex.get("kv") == "fp8":
            twin = name.removesuffix("-fp8")
        elif ex.get("q_len", 1) > 1:
            twin = name.replace(f"-q{ex['q_len']}", "")
        else:
            continue
        if (twin, "heuristic") not in by:
            continue
        ratio = [by[(twin, lab)].us / by[(name, lab)].us if ex.get("kv") == "fp8"
                 else by[(name, lab)].us / by[(twin, lab)].us
                 for lab in ("heuristic", "sweep-best")]
        best = by[(name, "sweep-best")]
        tf = f"{best.tflops:7.0f}" if best.tflops else "      -"
        what = "fp8 speedup" if ex.get("kv") == "fp8" else "time ratio"
        print(f"{name:40s} {twin:36s} {ratio[0]:7.2f} {ratio[1]:7.2f} {best.pct_ceiling:6.1f}%"
              f" {tf}  ({what})")


if __name__ == "__main__":
    main()
