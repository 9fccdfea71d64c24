"""The decode heuristic against a recorded full-space tune, by head dim (no GPU).

    python tools/heuristic_report.py                  # session 14's H200 tune, 3 worst keys
    python tools/heuristic_report.py --db other.sqlite --worst 5 --within 1.05

For every decode_attention key of the database, today's heuristic config is looked up among
the key's verified measurements (the baseline rows left out) and set against the key's
fastest. GQA/MHA keys are summarized per head dim: keys, geomean of heuristic / best, how
many are within the margin, the worst; then the worst keys with the heuristic's config and
time beside the best's. Latent (MLA) keys get a summary line, then the same by cache
dtype. A heuristic config the tune never measured counts as infinitely slow (a re-tune
would tell). The database is copied first: opening a store may migrate it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")  # only specs are used; no kernel runs here

from kdispatch.registry import get_op  # noqa: E402
from kdispatch.store import Store, digest  # noqa: E402

DB = Path(__file__).resolve().parents[1] / "bench/results/nvidia-h200/session14/h200.sqlite"
OP = "decode_attention"


@dataclass(frozen=True)
class KeyRow:
    """One recorded key: today's heuristic against the key's best measurement."""

    key: object
    heuristic: dict
    heuristic_us: float | None
    best: dict
    best_us: float

    @property
    def ratio(self) -> float:
        return math.inf if self.heuristic_us is None else self.heuristic_us / self.best_us


def recorded_rows(db: Path, device: str = "nvidia-h200") -> list[KeyRow]:
    """A :class:`KeyRow` per decode_attention key measured on ``device`` in ``db``."""
    spec = get_op(OP)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "recorded.sqlite"
        shutil.copyfile(db, copy)
        by_key: dict[str, list] = {}
        for m in Store(f"sqlite:///{copy}").measurements(device_key=device):
            if m.op == OP:
                by_key.setdefault(m.key_digest, []).append(m)
    out = []
    for ms in by_key.values():
        key = spec.parse_key(json.loads(ms[0].key_json))
        ok = [m for m in ms if m.status == "ok" and m.verified and m.median_us is not None
              and not m.is_baseline]
        if not ok:
            continue
        best = min(ok, key=lambda m: (m.median_us, m.id))
        heur = spec.heuristic(key).model_dump(mode="json")
        timed = [m.median_us for m in ok if m.config_digest == digest(heur)]
        out.append(KeyRow(key, heur, timed[0] if timed else None, json.loads(best.config_json),
                          best.median_us))
    return out


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def describe_key(key) -> str:
    kv = "fp8" if key.kv_dtype.startswith("float8") else key.kv_dtype
    return (f"{key.num_q_heads}/{key.num_kv_heads} x {key.head_dim} {kv} "
            f"b{key.batch} x {key.context:,}" + (f" q_len {key.q_len}" if key.q_len > 1 else ""))


def describe_config(cfg: dict) -> str:
    extra = [f for f in ("pdl", "merge") if cfg.get(f)]
    if cfg.get("kernel", "triton") != "triton":
        extra.append(cfg["kernel"])
    if cfg.get("plan"):
        extra.append("plan")
    n = cfg["num_kv_splits"]
    return (f"{n} split{'s' if n > 1 else ''}, {cfg['block_n']}/{cfg['block_h']}, "
            f"{cfg['num_warps']}w {cfg['num_stages']}st" + "".join(f" {e}" for e in extra))


def summary(rows: list[KeyRow], within: float) -> str:
    r = [row.ratio for row in rows]
    return (f"{len(r)} keys, geomean {geomean(r):.3f}, {sum(x <= within for x in r)} within "
            f"{100 * (within - 1):.0f}%, worst {max(r):.3f}")


def _worst_lines(rows: list[KeyRow], worst: int) -> list[str]:
    out = []
    for row in sorted(rows, key=lambda x: -x.ratio)[:worst]:
        us = "never measured" if row.heuristic_us is None else f"{row.heuristic_us:,.1f} us"
        out.append(f"    {row.ratio:.3f}  {describe_key(row.key)} p{row.key.page_size}: "
                   f"heuristic {describe_config(row.heuristic)} {us}; best "
                   f"{describe_config(row.best)} {row.best_us:,.1f} us")
    return out


def report(rows: list[KeyRow], worst: int = 3, within: float = 1.03) -> str:
    gqa = [row for row in rows if not row.key.latent]
    lines = ["GQA/MHA keys by head dim (heuristic / best):"]
    for dim in sorted({row.key.head_dim for row in gqa}):
        mine = [row for row in gqa if row.key.head_dim == dim]
        lines.append(f"  {dim}: {summary(mine, within)}")
        lines += _worst_lines(mine, worst)
    latent = [row for row in rows if row.key.latent]
    if latent:
        lines.append(f"latent (MLA) keys: {summary(latent, within)}")
        for kv in sorted({row.key.kv_dtype for row in latent}):
            mine = [row for row in latent if row.key.kv_dtype == kv]
            name = "fp8" if kv.startswith("float8") else kv
            lines.append(f"  {name} cache: {summary(mine, within)}")
            lines += _worst_lines(mine, worst)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=DB, help="a tuning database (SQLite file)")
    ap.add_argument("--device", default="nvidia-h200")
    ap.add_argument("--worst", type=int, default=3,
                    help="worst keys listed per head dim (and per latent cache dtype)")
    ap.add_argument("--within", type=float, default=1.03, help="margin counted (ratio)")
    args = ap.parse_args(argv)
    print(report(recorded_rows(args.db, args.device), args.worst, args.within))


if __name__ == "__main__":
    main()
