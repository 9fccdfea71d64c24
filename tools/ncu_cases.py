"""Run one decode or KV-write case a few times, eagerly, for Nsight Compute to profile.

The kernels run as a serving call gets them (the shipped table's config, or the
heuristic's), on seeded random inputs; ncu picks the launch to profile. Decode cases use
``tools/ab_decode.py``'s syntax (``name:batch,q_heads,kv_heads,head_dim,head_dim_v,
context[,fp8][,q2]``); a write case is ``write:tokens,heads,head_dim[,fp8]``. Each call of
the op is one launch per kernel, so ``--calls 3`` and ncu's ``--launch-skip 2`` profile
the third call, after compiling and planning::

    ncu --clock-control none --set full -k regex:_decode_stage1 --launch-skip 2 \\
        --launch-count 1 -o $OUT/gqa python3 tools/ncu_cases.py \\
        --case llama:4,32,8,128,128,262144
    ncu --import $OUT/gqa.ncu-rep --page details > $OUT/gqa.txt

(ncu reads hardware counters only where the machine's GPU runtime lets it: session 11's
two-H200 host did, a one-H200 host under a sandboxing runtime did not.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))


def decode_call(case: dict):
    import kdispatch
    from ab_decode import case_inputs

    q, k, v, bt, sl, scales = case_inputs(case, "cuda")
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl)
    print(f"{case['name']}: {cfg}", flush=True)
    return lambda: kdispatch.decode_attention(q, k, v, bt, sl, scale=case["dk"] ** -0.5,
                                              **scales)


def parse_write(text: str) -> tuple[int, int, int, bool]:
    """``write:tokens,heads,head_dim[,fp8]`` -> ``(tokens, heads, head_dim, fp8)``."""
    try:
        kind, rest = text.split(":", 1)
        parts = rest.split(",")
        tokens, heads, dim = (int(x) for x in parts[:3])
    except ValueError:
        kind, parts = "", []
    if kind != "write" or len(parts) < 3 or set(parts[3:]) - {"fp8"}:
        raise ValueError(f"--case {text!r}: expected write:tokens,heads,head_dim[,fp8]")
    return tokens, heads, dim, "fp8" in parts[3:]


def write_call(text: str):
    import torch

    import kdispatch

    tokens, heads, dim, fp8 = parse_write(text)
    g = torch.Generator(device="cuda").manual_seed(0)
    key = torch.randn(tokens, heads, dim, generator=g, device="cuda", dtype=torch.bfloat16)
    value = torch.randn(tokens, heads, dim, generator=g, device="cuda", dtype=torch.bfloat16)
    cdt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kc = torch.zeros(368, 16, heads, dim, device="cuda", dtype=cdt)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(368 * 16, generator=g, device="cuda")[:tokens]
    scales = ({"k_scale": torch.full((1,), 0.05, device="cuda"),
               "v_scale": torch.full((1,), 0.07, device="cuda")} if fp8 else {})
    cfg = kdispatch.resolve("kv_write", key=key, value=value, key_cache=kc, value_cache=vc,
                            slot_mapping=slots)
    print(f"{text}: {cfg}", flush=True)
    return lambda: kdispatch.write_kv(key, value, kc, vc, slots, **scales)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", required=True)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    import torch

    if args.case.startswith("write:"):
        call = write_call(args.case)
    else:
        from ab_decode import parse_case

        call = decode_call(parse_case(args.case))
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
