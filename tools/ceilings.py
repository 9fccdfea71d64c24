"""Measure the two ceilings every figure is reported against (BENCHMARKING.md), in one run.

    python tools/ceilings.py --out ceilings.json

- read: a streaming-read Triton kernel over 4 GiB (8 and 16 programs per SM, best kept);
- copy: a 4 GiB device-to-device copy, counting bytes read + written.
Medians of repeated timings on random data.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import read_ceiling  # noqa: E402


def copy_ceiling(nbytes: int = 4 << 30) -> dict:
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300,
                                 return_mode="median")
    assert torch.equal(dst, src), "copy ceiling: destination differs"
    del src, dst
    torch.cuda.empty_cache()
    return {"gbs": 2 * nbytes / ms / 1e6, "ms": ms, "bytes_read_plus_written": 2 * nbytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="ceilings.json")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "sms": props.multi_processor_count,
           "torch": torch.__version__, "triton": triton.__version__,
           "read": read_ceiling(props.multi_processor_count), "copy": copy_ceiling()}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"read ceiling {res['read']['gbs']:.0f} GB/s, copy ceiling {res['copy']['gbs']:.0f} GB/s")


if __name__ == "__main__":
    main()
