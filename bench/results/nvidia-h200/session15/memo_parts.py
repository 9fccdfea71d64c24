"""The memo hit's parts on this host (CPU time only; CUDA tensors when there is a GPU):
the public resolve's hit, the keyword call alone, the entry's guard, torch's C++ check of
the four tensors. Import path decides the tree (PYTHONPATH). Prints one JSON line.

    PYTHONPATH=$PWD python3 bench/results/nvidia-h200/session15/memo_parts.py
"""
import json
import os
import statistics
import sys
import timeit

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import kdispatch  # noqa: E402
from kdispatch.memo import HOT  # noqa: E402
from kdispatch.tensor_guard import shape_guard  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
bf = torch.bfloat16
q = torch.randn(1, 32, 128, dtype=bf, device=dev)
kc = torch.randn(8, 16, 8, 128, dtype=bf, device=dev)
vc = torch.randn_like(kc)
bt = torch.arange(8, dtype=torch.int32, device=dev).view(1, 8)
sl = torch.tensor([100], dtype=torch.int32, device=dev)
args = dict(q=q, k_cache=kc, v_cache=vc, block_table=bt, seq_lens=sl)
for _ in range(3):
    kdispatch.resolve("decode_attention", **args)
guard = HOT["decode_attention"].last.guard
check = shape_guard(q, kc, vc, bt)


def kw(op, /, **a):
    return None


G = dict(kdispatch=kdispatch, q=q, kc=kc, vc=vc, bt=bt, sl=sl, kw=kw, guard=guard,
         check=check, args=args)
CALL = '("decode_attention", q=q, k_cache=kc, v_cache=vc, block_table=bt, seq_lens=sl)'
cases = {"resolve hit": "kdispatch.resolve" + CALL, "keyword call": "kw" + CALL,
         "entry guard": "guard(args)", "C++ check, 4 tensors": "check(q, kc, vc, bt)"}
timers = {k: timeit.Timer(v, globals=G) for k, v in cases.items()}
xs = {k: [] for k in cases}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
    for k, t in timers.items():
        xs[k].append(t.timeit(4000) / 4000 * 1e9)
print(json.dumps({"tree": kdispatch.__file__, "python": sys.version.split()[0],
                  "torch": torch.__version__, "guard_is_torch_check": guard.__name__,
                  **{k: {"median_ns": round(statistics.median(v), 1),
                         "min_ns": round(min(v), 1)} for k, v in xs.items()}}))
