"""Where short-context MLA decode loses time: per-launch cost vs per-token cost (experiment).

At deepseek-v3 TP8 b32 x 16k the heuristic config reads ~78% of the read ceiling while the
same config reads ~92% at long context. This times that config (fixed split count, so one
compile and a fixed program count) over a ladder of contexts, whole op and stage 1 alone
(reduce skipped), with random and with sequential page tables, and fits
``time = a + b x tokens per split``: ``a`` is the per-launch cost, ``b`` the streaming rate.

    python tools/experiments/mla_launch_cost.py --out $OUT/mla_launch_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decode import Shape, live_bytes, make_sets, read_ceiling  # noqa: E402
from decode_sweep import reduce_share  # noqa: E402

from kdispatch.device import Device  # noqa: E402
from kdispatch.kernels.decode_attention import (  # noqa: E402
    SPEC, launch_decode_attention, reference_decode_attention,
)

CONTEXTS = (512, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default="mla_launch_cost.json")
    args = ap.parse_args()
    dev = Device.from_torch("cuda")
    ceiling = read_ceiling(dev.cu_count)["gbs"]
    cfg = SPEC.heuristic(SPEC.key(dev, dict(num_q_heads=16, num_kv_heads=1, head_dim=576,
                                            head_dim_v=512, batch=args.batch, context=16384)))
    rows = []
    for ctx in CONTEXTS:
        s = Shape(f"mla-b{args.batch}-c{ctx}", args.batch, 16, 1, 576, 512, ctx)
        (inp,) = make_sets(s, 1, seed=ctx)
        for order in ("random", "sequential"):
            if order == "sequential":
                bt = inp["block_table"]
                inp["block_table"] = torch.arange(bt.numel(), device=bt.device,
                                                  dtype=torch.int32).view_as(bt)
            out = launch_decode_attention(cfg, **inp)
            ref = reference_decode_attention(**inp)
            ok = torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
            times = reduce_share(cfg, [inp])
            full, stage1 = times["full_us"], times["stage1_us"]
            pct = 100 * live_bytes(s) / full / 1e3 / ceiling
            rows.append({"context": ctx, "order": order, "tokens_per_split":
                         ctx / cfg.num_kv_splits, "full_us": full, "stage1_us": stage1,
                         "pct": pct, "correct": ok})
            print(f"ctx {ctx:7d} {order:10s} full {full:8.1f} us ({pct:5.1f}%) stage1 "
                  f"{stage1:8.1f} us  correct={ok}", flush=True)
        del inp
        torch.cuda.empty_cache()
    fits = {}
    for order in ("random", "sequential"):
        for what in ("full_us", "stage1_us"):
            pts = [(r["tokens_per_split"], r[what]) for r in rows
                   if r["order"] == order and r["context"] >= 2048]
            a, b = fit([p[0] for p in pts], [p[1] for p in pts])
            fits[f"{order}/{what}"] = {"a_us": a, "b_us_per_token": b}
            print(f"fit {order:10s} {what:9s}: a = {a:6.1f} us per launch, "
                  f"b = {b * 1e3:6.2f} ns per token per program", flush=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv),
                                          "read_ceiling_gbs": ceiling,
                                          "config": cfg.model_dump(), "rows": rows,
                                          "fits": fits}, indent=1))


if __name__ == "__main__":
    main()
