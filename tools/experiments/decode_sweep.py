"""Wide config sweep of decode_attention at a few shapes (an experiment, not the benchmark).

The shipped heuristic was fitted on the tuner's capped sweeps (4-6 candidates per key);
this times a grid of split counts (by programs per SM) x tiles at the shapes where the
heuristic or the best known config missed a target, to see what the config space holds.
Uses tools/bench_decode.py's inputs, verification and graph timing.

    python tools/experiments/decode_sweep.py --shapes gqa-b8-c32768,mla-b32-c16384 \\
        --budget 240 --out $OUT/decode_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decode import (  # noqa: E402
    L2_BYTES, live_bytes, make_sets, read_ceiling, shapes, time_config,
)

from kdispatch.device import Device  # noqa: E402
from kdispatch.kernels.decode_attention import (  # noqa: E402
    SPEC, DecodeConfig, launch_decode_attention, reference_decode_attention,
)

PER_SM = (1, 2, 3, 4, 6, 8, 12, 16)
GQA_TILES = ((128, 4, 2), (64, 4, 2), (64, 4, 3), (128, 8, 2), (64, 8, 3))
MLA_TILES = ((32, 4, 3), (32, 4, 2), (64, 8, 2), (32, 8, 3), (16, 4, 3), (64, 4, 2))


def grid(key, sms: int, merge: bool = False) -> list[DecodeConfig]:
    heur = SPEC.heuristic(key).model_copy(update={"merge": False, "pdl": False})
    base = key.batch * key.num_kv_heads * -(-key.group // heur.block_h)
    splits = {1, heur.num_kv_splits}
    for p in PER_SM:
        splits.add(max(1, round(p * sms / base)))
    splits = sorted(s for s in splits if s <= min(256, max(1, key.context // 64)))
    tiles = MLA_TILES if key.latent else GQA_TILES
    out = [heur.model_copy(update={"merge": merge and heur.num_kv_splits > 1})]
    for s in splits:
        for bn, w, st in tiles:
            cfg = DecodeConfig(num_kv_splits=s, block_n=bn, block_h=heur.block_h,
                               num_warps=w, num_stages=st, merge=merge and s > 1)
            if cfg not in out and SPEC.is_valid(key, cfg):
                out.append(cfg)
    return out


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None


def reduce_share(cfg: DecodeConfig, sets: list[dict]) -> dict:
    """Times of ``cfg``: the whole op, and stage 1 alone (reduce skipped)."""
    import kdispatch.kernels.decode_attention as da

    full = time_config(cfg, sets)[0]
    reduce_kernel = da._decode_reduce
    da._decode_reduce = _NoLaunch()
    try:
        stage1 = time_config(cfg, sets)[0]
    finally:
        da._decode_reduce = reduce_kernel
    return {"config": cfg.model_dump(), "full_us": full, "stage1_us": stage1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, help="comma-separated name substrings")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds in all")
    ap.add_argument("--out", default="decode_sweep.json")
    ap.add_argument("--merge", action="store_true",
                    help="every split config merges in its last stage-1 program (no reduce)")
    ap.add_argument("--reduce-share", action="store_true",
                    help="only time the heuristic with and without its reduce kernel")
    args = ap.parse_args()
    t0 = time.time()
    dev = Device.from_torch("cuda")
    ceiling = read_ceiling(dev.cu_count)["gbs"]
    wanted = args.shapes.split(",")
    todo = [s for s in shapes() if any(w in s.name for w in wanted)]
    result = {"command": " ".join(sys.argv), "read_ceiling_gbs": ceiling,
              "torch": torch.__version__, "shapes": {}}
    per_shape = args.budget / max(1, len(todo))
    for i, s in enumerate(todo):
        deadline = t0 + per_shape * (i + 1)
        nsets = max(1, min(8, -(-4 * L2_BYTES // live_bytes(s))))
        sets = make_sets(s, nsets, seed=7)
        key = SPEC.key(dev, sets[0])
        ref = reference_decode_attention(**sets[0])
        atol, rtol = SPEC.tolerance(key)
        rows = []
        if args.reduce_share:
            result["shapes"][s.name] = reduce_share(SPEC.heuristic(key), sets)
            print(s.name, result["shapes"][s.name], flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
            continue
        for cfg in grid(key, dev.cu_count, args.merge):
            if time.time() > deadline:
                break
            try:
                out = launch_decode_attention(cfg, **sets[0])
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - record infeasible configs
                rows.append({"config": cfg.model_dump(), "status": str(exc)[:80]})
                continue
            if not torch.allclose(out.float(), ref, atol=atol, rtol=rtol):
                rows.append({"config": cfg.model_dump(), "status": "wrong"})
                continue
            us, q20, q80 = time_config(cfg, sets)
            pct = 100 * live_bytes(s) / us / 1e3 / ceiling
            rows.append({"config": cfg.model_dump(), "status": "ok", "us": us, "p20": q20,
                         "p80": q80, "pct": pct})
        ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["us"])
        result["shapes"][s.name] = {"heuristic": SPEC.heuristic(key).model_dump(),
                                    "rows": rows}
        print(f"{s.name}: {len(rows)} configs; heuristic {rows[0].get('us', 0):.1f} us "
              f"{rows[0].get('pct', 0):.1f}%", flush=True)
        for r in ok[:6]:
            print(f"   {r['us']:8.1f} us {r['pct']:5.1f}%  {r['config']}", flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
