"""Shipped tables: the wheel carries them, stale rows are not used, and GPUs without a table
fall back to a heuristic that fills their CU count."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kdispatch
from kdispatch import KDispatchWarning, dispatcher
from kdispatch.paths import find_table_file
from kdispatch.tables import read_table

ROOT = Path(__file__).resolve().parents[1]
KIMI = dict(batch=8, context=327600, num_q_heads=12, num_kv_heads=1, head_dim=576,
            head_dim_v=512, page_size=16, dtype="bfloat16")
LLAMA = dict(batch=1, context=131072, num_q_heads=32, num_kv_heads=8, head_dim=128,
             head_dim_v=128, page_size=16, dtype="bfloat16")


@pytest.mark.parametrize("device,cus", [("amd-mi355x", 256), ("nvidia-h100", 132),
                                        ("amd-mi300x", 304), ("nvidia-rtx-5090", 170)])
@pytest.mark.parametrize("shape", [KIMI, LLAMA], ids=["kimi-mla", "llama-gqa"])
def test_untabled_gpus_use_a_heuristic_that_fills_them(device, cus, shape):
    e = kdispatch.explain("decode_attention", device=device, **shape)
    assert e.provenance == "heuristic" and e.key.cu_count == cus
    head_groups = shape["num_kv_heads"] * -(-shape["num_q_heads"] // shape["num_kv_heads"]
                                             // e.config.block_h)
    base = shape["batch"] * head_groups  # programs of one split
    programs = base * e.config.num_kv_splits
    # a full wave, as full as whole splits make it: a GQA tile of one program per SM (head
    # dim 128, bf16) takes no partial second wave (H200 session 14: b1 x 131k 131.0 us at
    # 16 splits, 128 programs, against 175.8 at 17)
    assert programs > cus - base, (device, e.config)


def test_heuristic_split_count_follows_the_cu_count(monkeypatch):
    small = kdispatch.resolve("decode_attention", device="nvidia-h100", **KIMI).num_kv_splits
    monkeypatch.setenv("KDISPATCH_CU_NUM", "264")
    dispatcher.reset()
    assert kdispatch.resolve("decode_attention", device="nvidia-h100",
                             **KIMI).num_kv_splits > small


H200_TABLE = find_table_file("nvidia-h200")


def test_the_h200_table_ships_in_the_source_tree():
    assert H200_TABLE is not None and H200_TABLE.parent.name == "db"


def test_h200_table_records_device_and_toolchain():
    t = read_table(H200_TABLE)
    assert (t.device.key, t.device.arch, t.device.cu_count) == ("nvidia-h200", "sm_90", 132)
    assert t.toolchain.torch and t.toolchain.triton.startswith("3.6")
    ops = {e.op for e in t.entries}
    assert {"decode_attention", "kv_write"} <= ops
    for op in ops:
        assert t.source_hashes[op] == kdispatch.get_op(op).source_hash(), \
            f"{op} kernels changed since the table was tuned: retune and export it"


def test_stale_table_rows_fall_back_with_one_warning(tmp_path, monkeypatch):
    data = json.loads(H200_TABLE.read_text())
    for entry in data["entries"]:
        entry["source_hash"] = "0" * 16
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(data))
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="other kernel sources"):
        e = kdispatch.explain("decode_attention", device="nvidia-h200", **KIMI)
    # the stale entry is passed over; the next table on the path (the shipped one) serves
    assert e.provenance == "table"
    outcome = [c for c in e.consulted if c.source == "table"][0].outcome
    assert "entry is stale" in outcome and "hit in" in outcome
    # with the stale table alone on the path, the heuristic serves
    from kdispatch import errors, paths

    monkeypatch.setattr(paths, "builtin_table_dirs", lambda: [])
    errors.reset_warnings()
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="other kernel sources"):
        e = kdispatch.explain("decode_attention", device="nvidia-h200", **KIMI)
    assert e.provenance == "heuristic"


def test_wheel_ships_the_table_and_resolves_from_it(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist),
                            str(ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(dist.glob("kdispatch-*.whl"))
    # the wheel alone in a directory first on the path: works inside a virtual environment
    # too (a nested venv with system site packages would not see this one's dependencies)
    site = tmp_path / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-3000:]
    code = ("import json, kdispatch\n"
            f"e = kdispatch.explain('decode_attention', device='nvidia-h200', **{KIMI!r})\n"
            "print(json.dumps({'file': kdispatch.__file__, 'provenance': e.provenance,"
            " 'splits': e.config.num_kv_splits}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDISPATCH_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(site)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert str(site) in out["file"]  # the wheel, not the source tree
    assert out["provenance"] == "table" and out["splits"] >= 1
