"""Host cost per eager call: the public ops, the torch ops, an explicit config, beside a bare
Triton launch measured in the same run (the anchor), per ../shared/BENCHMARKING.md.

    python tools/bench_host.py --out bench/results/nvidia-h200/host.json     # on a GPU
    python tools/bench_host.py                                                # on the CPU

Tiny shapes, so the GPU idles and each call costs its host time. The cases are interleaved:
round r runs CALLS back-to-back calls of every case in turn (synchronized after each
case), so drift over the run hits all cases alike; a case's per-call microseconds are the
median and min over its ROUNDS rounds. The first call of each (compile and plan) is
reported apart. The ratios the targets of issue 15 are stated in are printed and stored
under "ratios" (medians, and mins beside them).

On the CPU (no GPU) kernels run in the Triton interpreter, whose per-call time is the
kernel's, not the host path's: there the resolve costs are measured, and the torch-op
overhead with the launch stubbed out (the public functions and the torch ops call one
launch function; it is replaced by a no-op for those rows only, returning a fresh output
as the real one does, so the difference of the two rows is what the torch op adds per
call: registration, argument boxing, wrapper, handing the output back).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kdispatch  # noqa: E402

ROUNDS, CALLS = 5, 3000
ANCHOR = "bare Triton launch (8 args, the anchor)"
MEMO_HIT = "resolve decode_attention (tensor form, memo hit)"
EMPTY = "empty call (the harness: its loop and a lambda returning None)"
FLOOR = "torch op floor (a no-op op of write_kv's lean schema)"


@triton.jit
def _anchor(a, b, c, d, n, s0, s1, s2, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(b + i, tl.load(a + i, mask=i < n), mask=i < n)


class Case:
    """One timed call; ``per`` calls of the measured thing per ``fn()``."""

    def __init__(self, fn: Callable[[], object], per: int = 1):
        self.fn, self.per = fn, per
        self.samples: list[float] = []
        self.first_us = 0.0


def measure(cases: dict[str, Case], calls: int, rounds: int, sync: Callable[[], None]) -> None:
    """First call, warm-up, then ``rounds`` rounds that each run every case in turn."""
    for c in cases.values():
        t0 = time.perf_counter()
        c.fn()
        sync()
        c.first_us = (time.perf_counter() - t0) * 1e6
        for _ in range(min(calls, 200)):
            c.fn()
        sync()
    for _ in range(rounds):
        for c in cases.values():
            fn = c.fn
            t = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            c.samples.append((time.perf_counter_ns() - t) / (calls * c.per) / 1e3)
            sync()


def row(c: Case) -> dict:
    return {"median_us": statistics.median(c.samples), "min_us": min(c.samples),
            "first_call_us": c.first_us, "samples_us": c.samples}


def gpu_cases(dev: str) -> dict[str, Case]:
    bf = torch.bfloat16
    a = torch.randn(64, device=dev)
    b = torch.empty_like(a)
    page = 16
    q = torch.randn(1, 32, 128, device=dev, dtype=bf)
    kc = torch.randn(8, page, 8, 128, device=dev, dtype=bf)
    vc = torch.randn_like(kc)
    bt = torch.arange(8, device=dev, dtype=torch.int32).view(1, 8)
    sl = torch.tensor([100], device=dev, dtype=torch.int32)
    ql = torch.randn(1, 16, 576, device=dev, dtype=bf)
    lat = torch.randn(8, page, 1, 576, device=dev, dtype=bf)
    lv = lat[..., :512]
    key = torch.randn(1, 8, 128, device=dev, dtype=bf)
    value = torch.randn_like(key)  # K and V distinct, as a serving call passes them
    slot = torch.tensor([3], device=dev)
    gqa_cfg = kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=vc,
                                block_table=bt, seq_lens=sl)
    ops, noop = torch.ops.kdispatch, _noop_op()
    return {
        ANCHOR: Case(lambda: _anchor[(1,)](a, b, a, b, 64, 1, 1, 1, BLOCK=64)),
        "decode_attention GQA 32/8x128":
            Case(lambda: kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.08)),
        "decode_attention GQA, explicit config":
            Case(lambda: kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.08,
                                                    config=gqa_cfg)),
        "torch.ops.kdispatch.decode_attention GQA":
            Case(lambda: ops.decode_attention(q, kc, vc, bt, sl, 0.08)),
        "decode_attention MLA 16x576/512":
            Case(lambda: kdispatch.decode_attention(ql, lat, lv, bt, sl, scale=0.04)),
        "torch.ops.kdispatch.decode_attention MLA":
            Case(lambda: ops.decode_attention(ql, lat, lv, bt, sl, 0.04)),
        "write_kv 1 token 8x128": Case(lambda: kdispatch.write_kv(key, value, kc, vc, slot)),
        "torch.ops.kdispatch.write_kv": Case(lambda: ops.write_kv(key, value, kc, vc, slot)),
        FLOOR: Case(lambda: noop(key, value, kc, vc, slot)),
        **resolve_cases(q, kc, vc, bt, sl),
    }


def _noop_op() -> Callable[..., None]:
    """A torch op that does nothing, registered as kdispatch's ops are, with write_kv's
    default (lean) schema: what torch itself charges per call of such an op."""
    from kdispatch.torch_library import define

    define("kdispatch_bench", "noop_write(Tensor key, Tensor value, Tensor(a!) key_cache, "
           "Tensor(b!) value_cache, Tensor slot_mapping) -> ()",
           lambda *a: None, lambda *a: None)
    return torch.ops.kdispatch_bench.noop_write


def resolve_cases(q, kc, vc, bt, sl) -> dict[str, Case]:
    plain = dict(device="nvidia-h200", batch=1, context=128, num_q_heads=32, num_kv_heads=8,
                 head_dim=128, page_size=16, dtype="bfloat16")
    return {
        EMPTY: Case(lambda: None),
        MEMO_HIT: Case(lambda: kdispatch.resolve("decode_attention", q=q, k_cache=kc,
                                                 v_cache=vc, block_table=bt, seq_lens=sl)),
        "resolve decode_attention (two signatures alternating, per resolve)": Case(
            lambda: (kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=vc,
                                       block_table=bt, seq_lens=sl),
                     kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=vc,
                                       block_table=bt, seq_lens=sl, sliding_window=64)),
            per=2),
        "resolve decode_attention (plain form, memo hit)":
            Case(lambda: kdispatch.resolve("decode_attention", **plain)),
    }


@contextlib.contextmanager
def stubbed_launches() -> Iterator[None]:
    """The launch function behind both the public functions and the torch ops, replaced by
    a no-op that returns a fresh output for decode and nothing for write_kv, as the real
    ones do (restored on exit)."""
    from kdispatch.kernels.decode_attention import launch as dlaunch
    from kdispatch.kernels.decode_attention import torch_op as dop
    from kdispatch.kernels.kv_write import launch as wlaunch
    from kdispatch.kernels.kv_write import torch_op as wop

    empty, bf16 = torch.empty, torch.bfloat16
    saved = [(m, n, getattr(m, n)) for m, n in ((dlaunch, "decode_attention"),
                                                (dop, "_decode"), (wlaunch, "write_kv"),
                                                (wop, "_write_kv"))]
    for m, n, _ in saved:
        # a fresh output per call, as the real launch returns: a torch op hands it back
        # through the boxed kernel (~0.5 us on the CPU that a kept tensor would hide)
        setattr(m, n, (lambda *a: empty(1, 32, 128, dtype=bf16)) if "decode" in n
                else (lambda *a: None))
    try:
        yield
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


def cpu_cases() -> dict[str, Case]:
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16)
    kc = torch.randn(8, 16, 8, 128, dtype=torch.bfloat16)
    bt = torch.arange(8, dtype=torch.int32).view(1, 8)
    sl = torch.tensor([100], dtype=torch.int32)
    ql = torch.randn(1, 16, 576, dtype=torch.bfloat16)
    lat = torch.randn(8, 16, 1, 576, dtype=torch.bfloat16)
    lv = lat[..., :512]
    key = torch.randn(1, 8, 128, dtype=torch.bfloat16)
    slot = torch.tensor([3])
    ops, noop = torch.ops.kdispatch, _noop_op()
    return {
        **resolve_cases(q, kc, kc, bt, sl),
        "decode_attention GQA, launch stubbed":
            Case(lambda: kdispatch.decode_attention(q, kc, kc, bt, sl, scale=0.08)),
        "torch.ops.kdispatch.decode_attention GQA, launch stubbed":
            Case(lambda: ops.decode_attention(q, kc, kc, bt, sl, 0.08)),
        "decode_attention MLA, launch stubbed":
            Case(lambda: kdispatch.decode_attention(ql, lat, lv, bt, sl, scale=0.04)),
        "torch.ops.kdispatch.decode_attention MLA, launch stubbed":
            Case(lambda: ops.decode_attention(ql, lat, lv, bt, sl, 0.04)),
        "write_kv 1 token 8x128, launch stubbed":
            Case(lambda: kdispatch.write_kv(key, key, kc, kc, slot)),
        "torch.ops.kdispatch.write_kv, launch stubbed":
            Case(lambda: ops.write_kv(key, key, kc, kc, slot)),
        FLOOR: Case(lambda: noop(key, key, kc, kc, slot)),
    }


#: (ratio name, numerator row, denominator row); the issue's targets in brackets
GPU_RATIOS = (
    ("decode GQA / bare launch [<= 1.5]", "decode_attention GQA 32/8x128", ANCHOR),
    ("decode MLA / bare launch [<= 1.5]", "decode_attention MLA 16x576/512", ANCHOR),
    ("write_kv / bare launch [<= 1.0]", "write_kv 1 token 8x128", ANCHOR),
    ("torch op / direct, GQA [<= 1.25]", "torch.ops.kdispatch.decode_attention GQA",
     "decode_attention GQA 32/8x128"),
    ("torch op / direct, MLA [<= 1.25]", "torch.ops.kdispatch.decode_attention MLA",
     "decode_attention MLA 16x576/512"),
    ("torch op / direct, write_kv [<= 1.25]", "torch.ops.kdispatch.write_kv",
     "write_kv 1 token 8x128"),
)
#: (name, torch-op row, direct row): what the torch op adds per call, in us (CPU)
CPU_OVERHEADS = (
    ("torch op - direct, decode GQA (us)",
     "torch.ops.kdispatch.decode_attention GQA, launch stubbed",
     "decode_attention GQA, launch stubbed"),
    ("torch op - direct, decode MLA (us)",
     "torch.ops.kdispatch.decode_attention MLA, launch stubbed",
     "decode_attention MLA, launch stubbed"),
    ("torch op - direct, write_kv (us)", "torch.ops.kdispatch.write_kv, launch stubbed",
     "write_kv 1 token 8x128, launch stubbed"),
)


def ratios(rows: dict, gpu: bool) -> dict:
    out = {}
    for stat in ("median_us", "min_us"):
        tag = stat.removesuffix("_us")
        if gpu:
            for name, num, den in GPU_RATIOS:
                out.setdefault(name, {})[tag] = rows[num][stat] / rows[den][stat]
        else:
            for name, op, direct in CPU_OVERHEADS:
                out.setdefault(name, {})[tag] = rows[op][stat] - rows[direct][stat]
        if FLOOR in rows:  # what the write op adds beyond torch's own cost of an op call
            op_row = "torch.ops.kdispatch.write_kv" + ("" if gpu else ", launch stubbed")
            direct = "write_kv 1 token 8x128" + ("" if gpu else ", launch stubbed")
            out.setdefault("write_kv torch op - direct - floor (us)", {})[tag] = (
                rows[op_row][stat] - rows[direct][stat] - rows[FLOOR][stat])
        out.setdefault("memo hit (us) [<= 1.0]", {})[tag] = rows[MEMO_HIT][stat]
        out.setdefault("memo hit less the empty call (us)", {})[tag] = (
            rows[MEMO_HIT][stat] - rows[EMPTY][stat])
    return out


def _native() -> str | None:
    """The native launch cache the torch ops' CUDA calls run through (None: the Python
    kernel; ``kdispatch build-ops`` builds it, ``KDISPATCH_FAST_OPS=0`` turns it off)."""
    from kdispatch.native.build import loaded

    path = loaded()
    return None if path is None else str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--calls", type=int, default=CALLS)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    kdispatch.load_torch_ops()
    cases = gpu_cases("cuda") if gpu else cpu_cases()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    with contextlib.nullcontext() if gpu else stubbed_launches():
        measure(cases, args.calls, args.rounds, sync)
    rows = {name: row(c) for name, c in cases.items()}
    info = {"device": torch.cuda.get_device_name() if gpu else "cpu",
            "torch": torch.__version__, "triton": triton.__version__,
            "python": sys.version.split()[0], "calls": args.calls, "rounds": args.rounds,
            "interleaved": True, "native_launch_cache": _native(),
            "rows": rows, "ratios": ratios(rows, gpu)}
    if args.out:
        Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    anchor = rows.get(ANCHOR)
    print(f"host cost per call on {info['device']} (median and min of {args.rounds} "
          f"interleaved rounds x {args.calls} calls); native launch cache: "
          f"{info['native_launch_cache'] or 'off'}")
    print(f"{'call':66s} {'median us':>10s} {'min us':>8s} {'x anchor':>9s} {'first ms':>9s}")
    for name, r in rows.items():
        ratio = f"{r['median_us'] / anchor['median_us']:.2f}" if anchor else "-"
        print(f"{name:66s} {r['median_us']:10.2f} {r['min_us']:8.2f} {ratio:>9s} "
              f"{r['first_call_us'] / 1e3:9.1f}")
    print(f"{'target quantity':66s} {'median':>10s} {'min':>8s}")
    for name, r in info["ratios"].items():
        print(f"{name:66s} {r['median']:10.2f} {r['min']:8.2f}")


if __name__ == "__main__":
    main()
