"""The heuristics against a recorded full-space tune (no GPU: the H200's measurements).

``bench/results/nvidia-h200/session14/h200.sqlite`` holds every valid candidate (up to 60)
of every preset key (166 keys, decode and KV writes, one H200): the decode rows tuned on
session 14's kernels (the Gluon MLA tile among the candidates), the KV-write rows on the
writer unchanged since session 10. Today's heuristic config of each key is looked up among
them: it must have been measured and come within 10% of the key's best at all but a few
keys, so a heuristic edit that loses what the tune found fails here. (When the kernels
change, re-tune and record again.) The GQA tile and split rules for head dims 64 and 256
and for fp8 caches, and the Gluon rule, were fitted to these measurements (before them,
bf16 head-dim-256 keys ran 1.22-1.30x the best, the 128-head MLA keys ~1.7x), and so were
the GQA rules of one program per SM, whole waves and the early reduce of short calls
(``tools/heuristic_report.py`` prints the figures by head dim). Session 31's tune
(``session31/h200.sqlite``: the first 8 candidates of every decode key on today's kernels,
the work plan and the narrow fp8 tile among them, and session 28's 16 of every writer key,
each key's first timed candidate timed again at its end) holds every key, the fp8 latents
on the Gluon tiles included; the tunes before session 20 hold every key but those.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from kdispatch.registry import get_op
from kdispatch.store import Store, digest

RESULTS = Path(__file__).resolve().parents[1] / "bench/results/nvidia-h200"
DB = RESULTS / "session14/h200.sqlite"


def _full_space(tmp: Path) -> dict[str, float]:
    """Session 14's full-space ratios; a key whose heuristic config that tune never timed
    (the early reduce at 640 KiB-1 MiB per SM since session 21: 55 x 96 b1 x 4k) is
    judged on the latest tune (``LATEST``), which timed it."""
    ratios = _ratios(tmp, DB)
    later = _ratios(tmp, LATEST)
    return {k: later.get(k, r) if math.isinf(r) else r for k, r in ratios.items()}


def _ratios(tmp: Path, db: Path = DB) -> dict[str, float]:
    assert db.is_file(), f"{db} is missing (committed with git add -f: *.sqlite is ignored)"
    copy = tmp / "recorded.sqlite"  # a copy: opening a store may migrate it
    shutil.copyfile(db, copy)
    by_key: dict[tuple[str, str], list] = {}
    for m in Store(f"sqlite:///{copy}").measurements(device_key="nvidia-h200"):
        by_key.setdefault((m.op, m.key_digest), []).append(m)
    out = {}
    for (op, _), ms in by_key.items():
        spec = get_op(op)
        key = spec.parse_key(json.loads(ms[0].key_json))
        ok = [m for m in ms if m.status == "ok" and m.verified and m.median_us is not None
              and not m.is_baseline]
        best = min(m.median_us for m in ok)
        want = digest(spec.heuristic(key).model_dump(mode="json"))
        heur = [m.median_us for m in ok if m.config_digest == want]
        out[f"{op} {ms[0].key_json}"] = heur[0] / best if heur else float("inf")
    return out


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


#: session 31's tune of today's kernels (the Gluon tile's fp8 latents, its bf16 seesaw, the
#: work plan and the narrow fp8 tile among them): the first 8 candidates of every preset
#: decode key, with session 28's 16 of every writer key (the writer unchanged), each key's
#: first timed candidate timed again at the key's end (the faster kept)
LATEST = RESULTS / "session31/h200.sqlite"


def test_the_heuristics_come_within_10_percent_of_the_recorded_best(tmp_path):
    ratios = _ratios(tmp_path, LATEST)
    assert len(ratios) == 166
    far = {k: round(r, 2) for k, r in ratios.items() if r > 1.10}
    assert len(far) <= 2, far
    assert max(ratios.values()) < 1.20, far
    assert _geomean(r for k, r in ratios.items() if k.startswith("decode")) < 1.01
    # session 14's full-space tune (up to 60 candidates a key) holds every key but the fp8
    # latents past 16 rows, whose Gluon tile came later: the same bar there
    old = {k: r for k, r in _full_space(tmp_path).items() if not _fp8_gluon(k)}
    assert len(old) == 166 - 24
    assert sum(r > 1.10 for r in old.values()) <= 2 and max(old.values()) < 1.20
    assert _geomean(r for k, r in old.items() if k.startswith("decode")) < 1.03


def _fp8_gluon(k: str) -> bool:
    """Whether the recorded key ``k`` is an fp8 latent the heuristic gives the Gluon tile
    (since session 20: the tunes before it never timed that)."""
    from kdispatch.kernels.decode_attention import spec

    if not k.startswith("decode") or "float8" not in k:
        return False
    key = get_op("decode_attention").parse_key(json.loads(k.split(" ", 1)[1]))
    return spec.gluon_fits(key) and key.rows > 16


def test_the_gqa_rules_hold_at_head_dims_64_and_256(tmp_path):
    dims = {k: r for k, r in _full_space(tmp_path).items()
            if k.startswith("decode") and any(f'"head_dim":{d},' in k for d in (64, 256))}
    assert len(dims) == 28
    assert max(dims.values()) < 1.12, dims
    assert _geomean(dims.values()) < 1.04  # 1.12 with the rules before session 12


def test_the_gluon_tile_is_the_heuristic_where_it_is_the_best(tmp_path):
    """Keys of more than 16 (token, head) rows on the Gluon tile's pages, bf16 and fp8
    latents: the heuristic takes it, and it is within 8% of the best there (the 128-head
    keys ran ~1.7x their best on the Triton tile; session 20's sweep timed the fp8 Gluon
    tile at 0.61-0.84x the best Triton tile's time)."""
    from kdispatch.kernels.decode_attention import spec

    op = get_op("decode_attention")
    gluon = {}
    for k, r in _ratios(tmp_path, LATEST).items():
        if k.startswith("decode"):
            key = op.parse_key(json.loads(k.split(" ", 1)[1]))
            if spec.gluon_fits(key) and key.rows > 16:
                assert op.heuristic(key).kernel == "gluon", k
                gluon[k] = r
    # deepseek-v3-dp 16, kimi and deepseek TP8 two-token 4 each; bf16 and fp8
    assert len(gluon) == 48 and sum("float8" in k for k in gluon) == 24
    # before the tuner timed a key's first candidate again at its end, whichever split
    # count came first measured up to ~10% slow at these keys (the heuristic's 16 heads x
    # 2 tokens, b8 x 393,216 at 1.117x in session 14's tune, 1.037x in session 13's).
    # Named, the one key past 1.08 in session 31's tune: the bf16 seesaw at 128 heads b128 x
    # 16,384, its heuristic 2 splits 1.083x the unsplit grid's time. The same code ran 0.99x
    # in session 29's tune, and 1.04x in session 31's retime (4 alternating rounds,
    # call3-seesaw.json): the spread between runs of one key, not a rule.
    spread = {(128, 128, 16384, "bfloat16")}
    for k, r in gluon.items():
        key = json.loads(k.split(" ", 1)[1])
        named = (key["num_q_heads"], key["batch"], key["context"], key["kv_dtype"]) in spread
        assert r < (1.09 if named else 1.08), (k, r)
    assert sum(r > 1.03 for r in gluon.values()) <= 3, gluon


def test_the_latent_split_rules_hold_on_the_balanced_grids_tune(tmp_path):
    """The wide (64-row) latent tile's split rules (spec.LATENT_WIDE_*): two waves where
    each split keeps 8k tokens and the one wave already gives a request 4 splits, a second
    split at 8k tokens or more below 4 waves for bf16. First fitted to session 18's tune
    (before them: 3 of the 64 MLA keys above 1.10x their best, 19 above 1.03, geomean
    1.028), refitted to session 22's (the Gluon tile's copies in a warp of their own,
    which runs 128 heads faster in one wave): before the refit there, 8 keys above 1.03
    (128 heads b32 x 32,768-65,536 at the two waves' 4 splits, fp8 two tokens at the
    second split), geomean 1.009; after it 3 and 1.005. On session 23's tune (the seesaw
    at 64-token pages) its own rules (spec.SEESAW_*: two waves from 2 splits, the forced
    second split from 16k tokens) took the MLA keys above 1.03 from 4 to 2 and the geomean
    from 1.006 to 1.004. The tunes before session 22 timed earlier kernels, whose
    trade-off the refits no longer follow."""
    new = {k: round(r, 3) for k, r in _ratios(tmp_path, LATEST).items()
           if k.startswith("decode") and '"head_dim":576,' in k}
    assert len(new) == 64
    # session 31's tune (8 candidates a key; the narrow tile at the fp8 latents of 16 rows,
    # which the tuner had best at all 8 such keys) leaves one key above 1.03, named here;
    # any other fails: the bf16 seesaw at 128 heads b128 x 16,384 (the forced second split
    # 1.083x the unsplit grid; 0.99x in session 29's tune and 1.04x in session 31's retime,
    # call3-seesaw.json: the spread between runs; the second split stays for the ragged
    # batches it balances, decode_notes v23, v25). Session 29's tune had two others there
    # (16 heads b32 x 393,216 bf16 with pdl 1.033x, the seesaw's b128 x 65,536 1.032x).
    known = {(128, 128, 16384, 1, "bfloat16")}
    far = {k: r for k, r in new.items() if r > 1.03}
    for k in far:
        key = json.loads(k.split(" ", 1)[1])
        assert (key["num_q_heads"], key["batch"], key["context"], key["q_len"],
                key["kv_dtype"]) in known, (k, far[k])
    assert max(new.values()) < 1.09, far
    assert _geomean(new.values()) < 1.007
    bf16 = [r for k, r in new.items() if '"kv_dtype":"bfloat16"' in k]
    assert len(bf16) == 32 and _geomean(bf16) < 1.009


#: GQA/MHA keys of the recorded tune by head dim
GQA_KEYS = {64: 14, 96: 4, 128: 24, 256: 14}


def test_every_gqa_head_dim_is_within_3_percent_of_the_recorded_best(tmp_path):
    """Issue #18: every GQA/MHA key of every head dim within 3% of its best. Before the
    rules of one program per SM (whole waves, 2 stages where the grid does not tile the
    SMs) and the early reduce of short calls: 64: 9 of 14 keys (geomean 1.027), 96: 2 of 4
    (1.047, the 55-head b1 x 4k at 1.147), 128: 17 of 24 (1.026, b1 x 8k at 1.124), 256: 13
    of 14 (1.009)."""
    ratios = _full_space(tmp_path)
    for dim, n in GQA_KEYS.items():
        mine = {k: round(r, 3) for k, r in ratios.items()
                if k.startswith("decode") and f'"head_dim":{dim},' in k}
        assert len(mine) == n, dim
        assert max(mine.values()) <= 1.03, (dim, {k: r for k, r in mine.items() if r > 1.03})
        assert _geomean(mine.values()) < 1.01, dim


def test_the_report_tool_prints_every_head_dim(capsys):
    from tool_modules import tool

    tool("heuristic_report").main(["--db", str(LATEST), "--worst", "1"])
    out = capsys.readouterr().out
    for dim, n in GQA_KEYS.items():
        assert f"  {dim}: {n} keys, geomean 1.0" in out
    assert "latent (MLA) keys: 64 keys" in out
    # the latent keys by cache dtype, each with its worst key
    assert "  bfloat16 cache: 32 keys, geomean 1.0" in out
    assert "  fp8 cache: 32 keys, geomean 1.0" in out
    lines = out.splitlines()
    fp8 = lines.index(next(x for x in lines if x.startswith("  fp8 cache:")))
    assert " fp8 b" in lines[fp8 + 1] and "heuristic" in lines[fp8 + 1]
