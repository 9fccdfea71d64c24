"""tools/ab_decode.py: the same-run A/B harness (both sides in the interpreter here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import tool

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "ab_decode.py"


def test_two_trees_alternate_and_report_a_ratio_per_case_and_config(tmp_path):
    out = tmp_path / "ab.json"
    cfg = '{"num_kv_splits": 2, "block_n": 16, "block_h": 16, "num_warps": 4, "num_stages": 1}'
    res = subprocess.run([sys.executable, str(TOOL), "--cpu", "--ref-path", str(ROOT),
                          "--case", "gqa:3,4,2,32,32,40,rag", "--case", "mla8:1,4,1,48,32,33,fp8",
                          "--config", "heuristic", "--config", cfg, "--rounds", "2",
                          "--reps", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["config"]) for r in rows] == [
        ("gqa", "heuristic"), ("gqa", cfg), ("mla8", "heuristic"), ("mla8", cfg)]
    for r in rows:
        assert len(r["rounds_ref"]) == len(r["rounds_cur"]) == 2
        assert r["cur_over_ref"] > 0 and r["resolved_cur"]["num_kv_splits"] >= 1
    assert rows[1]["resolved_cur"]["num_kv_splits"] == 2
    assert "cur/ref" in res.stdout


@pytest.mark.parametrize("bad", ["x", "x:1,2,3", "x:1,2,3,4,5,6,fp16"])
def test_a_malformed_case_names_itself(bad):
    with pytest.raises(ValueError, match="--case"):
        tool("ab_decode").parse_case(bad)


def test_a_ragged_case_draws_lengths_within_its_context():
    import torch

    ab = tool("ab_decode")
    case_inputs, parse_case = ab.case_inputs, ab.parse_case
    case = parse_case("r:64,4,2,32,32,100,rag")
    assert case["ragged"] and not parse_case("u:64,4,2,32,32,100")["ragged"]
    sl = case_inputs(case, torch.device("cpu"))[4]
    assert sl.min() >= 1 and sl.max() <= 100 and len(set(sl.tolist())) > 10
    assert torch.equal(sl, case_inputs(case, torch.device("cpu"))[4])  # seeded


def test_a_p64_case_has_64_token_pages_and_the_same_lengths():
    import torch

    ab = tool("ab_decode")
    case = ab.parse_case("m:2,16,1,48,32,130,p64")
    assert case["page"] == 64 and ab.parse_case("m:2,16,1,48,32,130")["page"] == 16
    q, k, v, bt, sl, _ = ab.case_inputs(case, torch.device("cpu"))
    assert k.shape[1] == 64 and bt.shape == (2, 3) and sl.tolist() == [130, 130]
    assert torch.equal(v, k[..., :32])  # a latent case shares its cache


def test_heuristic_means_the_heuristic_whatever_the_side_resolves(monkeypatch):
    """A table, database or override the side can see does not change what "heuristic"
    times (a checkout's db/ table is found even with KDISPATCH_TABLE_DIR set)."""
    import torch

    import kdispatch
    from kdispatch import dispatcher

    ab = tool("ab_decode")

    override = {"num_kv_splits": 3, "block_n": 16, "block_h": 16, "num_warps": 4,
                "num_stages": 1}
    monkeypatch.setenv("KDISPATCH_OVERRIDE", json.dumps({"decode_attention": override}))
    dispatcher.reset()
    case = ab.parse_case("gqa:2,4,2,32,32,40")
    row = ab._child([case], ["heuristic"], 1, True)[0]
    q, k, v, bt, sl, _ = ab.case_inputs(case, torch.device("cpu"))
    assert kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                             seq_lens=sl).num_kv_splits == 3   # the side resolves the override
    key = kdispatch.explain("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl).key
    assert row["resolved"] == kdispatch.get_op("decode_attention").heuristic(key).model_dump()
    assert row["resolved"]["num_kv_splits"] != 3
