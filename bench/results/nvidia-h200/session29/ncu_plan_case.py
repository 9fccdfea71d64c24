"""Session 29, call 3: one full-context 128-head batch (b32 x 16,384, 64-token pages, bf16)
through the Gluon stage 1 as the split grid (``s2``) or as the work plan forced to 64 parts
(``p64``: the same work, each program half a request, one segment), three eager calls for
Nsight Compute (``--launch-skip 2 --launch-count 1``)::

    ncu ... python3 bench/results/nvidia-h200/session29/ncu_plan_case.py --config p64
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "tools"))
from bench_decode import make_sets  # noqa: E402
from plan_launches import case_shape  # noqa: E402

import kdispatch.kernels.decode_attention.launch as L  # noqa: E402
from kdispatch.kernels.decode_attention.spec import gluon_config  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True, choices=["s2", "p64"])
args = ap.parse_args()
inp = make_sets(case_shape("full-b32:32,16384"), 1, 0)[0]
if args.config == "p64":
    L.plan_parts = lambda s, cu, rows: 64
cfg = gluon_config(2, False) if args.config == "s2" else gluon_config(1, True)
for _ in range(3):
    L.launch_decode_attention(cfg, **inp)
torch.cuda.synchronize()
print(args.config, "done")
