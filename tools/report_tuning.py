"""Tuned vs heuristic vs baseline for every tuned key, from a tuning database.

    python tools/report_tuning.py --db h200.sqlite --device nvidia-h200 \
        --ceilings bench/results/nvidia-h200/ceilings.json \
        --json bench/results/nvidia-h200/tuning.json --md tuning.md

Times are the tuner's medians of CUDA-graph replays (each candidate verified against the
fp32 reference first). GB/s is the op's minimal bytes (``bytes_moved``: decode reads each
live K/V element once, MLA its latent once; a KV write reads and writes each element once)
over the median; % is against the ceiling measured in the same GPU session (read ceiling for
decode attention, copy ceiling for KV writes). The baseline is split count 1 for decode
attention and two indexed assignments for KV writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")  # only specs are used; no kernel runs here

from kdispatch.registry import get_op  # noqa: E402
from kdispatch.store import Store, digest  # noqa: E402

from kdispatch.opdef import DEVICE_FIELDS  # noqa: E402

#: key fields left out of the report's shape column (the same for every row of one table)
QUIET_FIELDS = {*DEVICE_FIELDS, "dtype", "page_size", "sliding", "batch_invariant"}


def rows(store: Store, device: str, ceilings: dict, min_run: int = 0,
         by_run: dict[int, dict] | None = None) -> list[dict]:
    """One row per key whose measurements come from runs >= ``min_run``. Each figure is set
    against the ceilings of the session that measured it: ``by_run`` maps a tuning run id to
    that session's ceilings (``ceilings`` otherwise)."""
    by_key: dict[tuple[str, str], list] = {}
    for m in store.measurements(device_key=device):
        if (m.run_id or 0) < min_run:
            continue
        by_key.setdefault((m.op, m.key_digest), []).append(m)
    out = []
    for (op, _), ms in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[1][0].id)):
        spec = get_op(op)
        ms = [m for m in ms if m.source_hash == spec.source_hash()]  # today's kernels only
        if not ms:
            continue
        key = spec.parse_key(json.loads(ms[0].key_json))
        ok = [m for m in ms if m.status == "ok" and m.verified and m.median_us is not None]
        if not ok:
            continue
        tuned = min((m for m in ok if not m.is_baseline), key=lambda m: (m.median_us, m.id),
                    default=None)
        # today's heuristic (a database may hold the configs of an older heuristic too)
        heur_d = digest(spec.heuristic(key).model_dump(mode="json"))
        heur = next((m for m in ok if m.config_digest == heur_d), None)
        base_cfg = spec.tuning.baseline(key)
        base_d = digest(base_cfg.model_dump(mode="json")) if base_cfg is not None else None
        base = next((m for m in ok if m.config_digest == base_d), None)
        nbytes = spec.tuning.bytes_moved(key)

        def fig(m):
            if m is None:
                return None
            ceiling = (by_run or {}).get(m.run_id, ceilings)[spec.tuning.ceiling]["gbs"]
            gbs = nbytes / (m.median_us * 1e3)
            return {"us": round(m.median_us, 2), "p20_us": m.p20_us, "p80_us": m.p80_us,
                    "gbs": round(gbs, 1), "pct": round(100 * gbs / ceiling, 1),
                    "config": json.loads(m.config_json)}

        shape = {f: v for f, v in key.model_dump().items() if f not in QUIET_FIELDS}
        out.append({"op": op, "key": shape,
                    "candidates": len(ms), "rejected": sum(m.status == "rejected" for m in ms),
                    "infeasible": sum(m.status == "infeasible" for m in ms),
                    "runs": sorted({m.run_id for m in ms}),
                    "tuned": fig(tuned), "heuristic": fig(heur), "baseline": fig(base),
                    "bytes": nbytes})
    return out


def markdown(rs: list[dict]) -> str:
    lines = ["| op | shape | baseline us (% ceil) | heuristic us (% ceil) | tuned us (GB/s, % ceil) "
             "| tuned / heuristic | candidates (rejected, infeasible) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rs:
        shape = " ".join(f"{k}={v}" for k, v in r["key"].items())
        b, h, t = r["baseline"], r["heuristic"], r["tuned"]
        cell = (lambda f: "-" if f is None else f"{f['us']:,.2f} ({f['pct']:.0f}%)")
        speed = f"{h['us'] / t['us']:.2f}x" if h and t else "-"
        lines.append(f"| {r['op']} | {shape} | {cell(b)} | {cell(h)} | "
                     f"{t['us']:,.2f} ({t['gbs']:,.0f}, {t['pct']:.0f}%) | {speed} | "
                     f"{r['candidates']} ({r['rejected']}, {r['infeasible']}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--device", default="nvidia-h200")
    ap.add_argument("--ceilings", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--min-run", type=int, default=0,
                    help="only measurements of tuning runs with this id or later")
    ap.add_argument("--run-ceilings", default="",
                    help="RUN=PATH,... ceilings measured in the session of each tuning run")
    args = ap.parse_args()
    ceilings = json.loads(Path(args.ceilings).read_text())
    store = Store(args.db, create=False)
    by_run = {int(r): json.loads(Path(p).read_text())
              for r, p in (item.split("=", 1) for item in args.run_ceilings.split(",") if item)}
    rs = rows(store, args.device, ceilings, args.min_run, by_run)
    if args.json:
        Path(args.json).write_text(json.dumps({"ceilings": ceilings, "rows": rs}, indent=1))
    md = markdown(rs)
    if args.md:
        Path(args.md).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
