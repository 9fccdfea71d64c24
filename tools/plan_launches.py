"""Where a Gluon MLA decode call's time goes, launch by launch: each config's whole call
and each of its launches (the work plan's kernel, stage 1, the reduce) alone, as CUDA-graph
replays on the same inputs (128 heads, 576/512 latent, 64-token pages, bf16). Run it once
per source tree (``PYTHONPATH=<tree>``) in one device call to compare two kernels' launches::

    python tools/plan_launches.py --config s2='{"num_kv_splits": 2}' \\
        --config pl1='{"num_kv_splits": 1, "plan": true}' --out $OUT/launches.json

A case is ``name:batch,context[,rag]`` (``rag``: bench_decode's ragged lengths around a
mean of ``context``, in a table twice as wide).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import Shape, make_sets, time_fns  # noqa: E402

from kdispatch.kernels.decode_attention.launch import (  # noqa: E402
    launch_decode_attention, planned_launches)
from kdispatch.kernels.decode_attention.spec import gluon_config  # noqa: E402

CASES = ("full-b32:32,16384", "parts-b66:66,16384", "rag-b128:128,16384,rag",
         "rag-b128-4k:128,4096,rag")


def case_shape(case: str) -> Shape:
    """A case as bench_decode's shape: 128 heads, the 576/512 latent, 64-token pages,
    bf16."""
    name, spec = case.split(":")
    parts = spec.split(",")
    batch, ctx = int(parts[0]), int(parts[1])
    rag = "rag" in parts[2:]
    return Shape(name, batch, 128, 1, 576, 512, 2 * ctx if rag else ctx, page=64,
                 mean=ctx if rag else 0)


def parse_configs(items: list[str]) -> dict:
    """``NAME=JSON`` items (``num_kv_splits``, optional ``plan``) as Gluon configs."""
    cfgs = {}
    for item in items:
        name, js = item.split("=", 1)
        d = json.loads(js)
        cfgs[name] = gluon_config(int(d["num_kv_splits"]), bool(d.get("plan", False)))
    return cfgs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="NAME=JSON (Gluon fields)")
    ap.add_argument("--case", action="append", default=[], help="name:batch,context[,rag]")
    ap.add_argument("--out", default="")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    cfgs = parse_configs(args.config)
    rows = []
    for case in args.case or CASES:
        shape = case_shape(case)
        inp = make_sets(shape, 1, 0)[0]
        for cname, cfg in cfgs.items():
            call = time_fns([lambda: launch_decode_attention(cfg, **inp)])[0]
            each = [(t.fn.__name__, time_fns([t.run])[0]) for t in planned_launches(cfg, **inp)]
            row = {"tag": args.tag, "case": shape.name, "config": cname, "call_us": round(call, 1),
                   "launches_us": {n: round(us, 1) for n, us in each}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
