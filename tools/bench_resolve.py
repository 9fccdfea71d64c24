"""Median cost of a memo-hit resolve, beside a bare dict lookup of a tuple, in one run.

    python tools/bench_resolve.py            # prints a table; --json for machine output

Target (issue 2): under 2 microseconds per memo-hit resolve on a 2-core CPU machine.
The tensor form uses CPU tensors (only shapes/dtypes/devices are read, so the device does
not matter for the cost of a resolve). The last row is the resolve that
``kdispatch.decode_attention`` makes (an argument dict, no keyword-call packing).
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
os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors resolve to the interpreter

import torch  # noqa: E402

import kdispatch  # noqa: E402
from kdispatch.dispatcher import dispatcher  # noqa: E402


def _median_ns(fn, inner: int = 20000, rounds: int = 15) -> float:
    fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    plain = dict(device="nvidia-h200", batch=8, context=327600, num_q_heads=12, num_kv_heads=1,
                 head_dim=576, head_dim_v=512, page_size=16, dtype="bfloat16")
    q = torch.randn(8, 12, 576, dtype=torch.bfloat16)
    kc = torch.randn(64, 16, 1, 576, dtype=torch.bfloat16)
    bt = torch.zeros(8, 4, dtype=torch.int32)
    sl = torch.ones(8, dtype=torch.int32)
    tensor = dict(q=q, k_cache=kc, v_cache=kc[..., :512], block_table=bt, seq_lens=sl)
    k = torch.randn(8, 16, 128, dtype=torch.bfloat16)
    cache = torch.randn(32, 16, 16, 128, dtype=torch.bfloat16)
    kv = dict(key=k, value=k, key_cache=cache, value_cache=cache,
              slot_mapping=torch.arange(8, dtype=torch.int64))

    d = {("decode_attention", 8, 327600, 12, 1, 576): object()}
    tup = ("decode_attention", 8, 327600, 12, 1, 576)
    disp = dispatcher()
    serving = dict(tensor, sliding_window=None, batch_invariant=False)  # as decode_attention()
    rows = {
        "dict lookup of a tuple": _median_ns(lambda: d[tup]),
        "resolve decode_attention, plain form": _median_ns(
            lambda: kdispatch.resolve("decode_attention", **plain)),
        "resolve decode_attention, tensor form": _median_ns(
            lambda: kdispatch.resolve("decode_attention", **tensor)),
        "resolve kv_write, tensor form": _median_ns(lambda: kdispatch.resolve("kv_write", **kv)),
        "decode_attention() serving-path resolve": _median_ns(
            lambda: disp.resolve("decode_attention", serving)),
    }
    assert kdispatch.explain("decode_attention", **plain).provenance == "memo"
    if args.json:
        print(json.dumps({k: v / 1000 for k, v in rows.items()}, indent=1))
        return
    base = rows["dict lookup of a tuple"]
    print(f"{'what':42s} {'median us':>10s} {'x dict':>8s}")
    for name, ns in rows.items():
        print(f"{name:42s} {ns / 1000:10.3f} {ns / base:8.1f}")


if __name__ == "__main__":
    main()
