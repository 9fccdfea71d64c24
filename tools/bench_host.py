"""Host cost per eager call: the public ops, the torch ops, an explicit config, beside a bare
Triton launch measured in the same run (the anchor), per ../shared/BENCHMARKING.md.

    python tools/bench_host.py --out bench/results/nvidia-h200/host.json     # on a GPU
    python tools/bench_host.py                                                # on the CPU

Tiny shapes, so the GPU idles and each call costs its host time: per-call microseconds are
the median (and min) over ROUNDS rounds of CALLS back-to-back calls, synchronized only
between rounds. The first call of each (compile and plan) is reported apart. On the CPU
(no GPU) only the resolve costs are measured: kernels run in the Triton interpreter there,
whose per-call time is the kernel's, not the host path's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import kdispatch  # noqa: E402

ROUNDS, CALLS = 5, 3000


@triton.jit
def _anchor(a, b, c, d, n, s0, s1, s2, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(b + i, tl.load(a + i, mask=i < n), mask=i < n)


def per_call_us(fn, calls: int, rounds: int, sync) -> dict:
    t0 = time.perf_counter()
    fn()
    sync()
    first = (time.perf_counter() - t0) * 1e6
    for _ in range(min(calls, 200)):
        fn()
    sync()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t) / calls / 1e3)
        sync()
    return {"median_us": statistics.median(samples), "min_us": min(samples),
            "first_call_us": first}


def gpu_cases(dev: str) -> dict:
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
    key = torch.randn(1, 8, 128, device=dev, dtype=bf)
    slot = torch.tensor([3], device=dev)
    gqa_cfg = kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=vc,
                                block_table=bt, seq_lens=sl)
    ops = torch.ops.kdispatch
    return {
        "bare Triton launch (8 args, the anchor)":
            lambda: _anchor[(1,)](a, b, a, b, 64, 1, 1, 1, BLOCK=64),
        "decode_attention GQA 32/8x128":
            lambda: kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.08),
        "decode_attention GQA, explicit config":
            lambda: kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.08, config=gqa_cfg),
        "torch.ops.kdispatch.decode_attention GQA":
            lambda: ops.decode_attention(q, kc, vc, bt, sl, 0.08),
        "decode_attention MLA 16x576/512":
            lambda: kdispatch.decode_attention(ql, lat, lat[..., :512], bt, sl, scale=0.04),
        "torch.ops.kdispatch.decode_attention MLA":
            lambda: ops.decode_attention(ql, lat, lat[..., :512], bt, sl, 0.04),
        "write_kv 1 token 8x128":
            lambda: kdispatch.write_kv(key, key, kc, vc, slot),
        "torch.ops.kdispatch.write_kv":
            lambda: ops.write_kv(key, key, kc, vc, slot),
        "resolve decode_attention (tensor form, memo hit)":
            lambda: kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=vc,
                                      block_table=bt, seq_lens=sl),
    }


def cpu_cases() -> dict:
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16)
    kc = torch.randn(8, 16, 8, 128, dtype=torch.bfloat16)
    bt = torch.arange(8, dtype=torch.int32).view(1, 8)
    sl = torch.tensor([100], dtype=torch.int32)
    plain = dict(device="nvidia-h200", batch=1, context=128, num_q_heads=32, num_kv_heads=8,
                 head_dim=128, page_size=16, dtype="bfloat16")
    return {
        "resolve decode_attention (tensor form, memo hit)":
            lambda: kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=kc,
                                      block_table=bt, seq_lens=sl),
        "resolve decode_attention (plain form, memo hit)":
            lambda: kdispatch.resolve("decode_attention", **plain),
    }


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
    rows = {name: per_call_us(fn, args.calls, args.rounds, sync) for name, fn in cases.items()}
    anchor = rows.get("bare Triton launch (8 args, the anchor)")
    info = {"device": torch.cuda.get_device_name() if gpu else "cpu",
            "torch": torch.__version__, "triton": triton.__version__,
            "calls": args.calls, "rounds": args.rounds, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    print(f"host cost per call on {info['device']} (median of {args.rounds} x {args.calls})")
    print(f"{'call':52s} {'median us':>10s} {'min us':>8s} {'x anchor':>9s} {'first ms':>9s}")
    for name, r in rows.items():
        ratio = f"{r['median_us'] / anchor['median_us']:.2f}" if anchor else "-"
        print(f"{name:52s} {r['median_us']:10.2f} {r['min_us']:8.2f} {ratio:>9s} "
              f"{r['first_call_us'] / 1e3:9.1f}")


if __name__ == "__main__":
    main()
