"""The kdispatch CLI through click's CliRunner."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tuning"))
import fakeops  # noqa: E402

import kdispatch  # noqa: E402
from kdispatch import dispatcher  # noqa: E402
from kdispatch.cli import main  # noqa: E402
from kdispatch.store import Store  # noqa: E402
from kdispatch.tables import read_table  # noqa: E402

COMMANDS = ("tune", "resolve", "explain", "show", "export", "import", "merge", "doctor")


def _ok(result):
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.mark.parametrize("cmd", (None, *COMMANDS))
def test_every_command_has_help_with_an_example(runner, cmd):
    out = _ok(runner.invoke(main, [cmd, "--help"] if cmd else ["--help"]))
    assert "Example" in out and "kdispatch " in out
    if cmd:
        assert f"kdispatch {cmd}" in out


def test_tune_smoke_end_to_end_then_resolve_from_database(runner, tmp_path, monkeypatch):
    db = tmp_path / "smoke.sqlite"
    monkeypatch.setenv("KDISPATCH_DB", str(db))
    out = _ok(runner.invoke(main, ["tune", "--device", "cpu", "--preset", "smoke",
                                   "--db", str(db)]))
    assert "tuning summary" in out and "measured" in out
    store = Store(str(db))
    best = store.best(device_key="cpu-interpreter")
    assert {b.op for b in best} == {"kv_write", "decode_attention"} and len(best) == 4
    assert not [m for m in store.measurements() if m.status != "ok"]
    dispatcher.reset()
    checked = 0
    for row in best:
        spec = kdispatch.get_op(row.op)
        if row.source_hash != spec.source_hash():
            continue  # a kernel source edited during the run: stale, correctly not used
        args = {k: v for k, v in row.key.items() if k not in ("vendor", "arch", "cu_count")}
        if row.op == "decode_attention":
            args.pop("sliding")
        e = kdispatch.explain(row.op, **args)
        assert e.provenance == "database", e.consulted
        assert e.config.model_dump(mode="json") == row.config
        checked += 1
    assert checked >= 2
    # the CLI says the same
    d = next(b for b in best if b.op == "decode_attention")
    k = d.key
    out = _ok(runner.invoke(main, [
        "resolve", "decode_attention", "--device", "cpu-interpreter", "--batch", str(k["batch"]),
        "--context", str(k["context"]), "--num-q-heads", str(k["num_q_heads"]),
        "--num-kv-heads", str(k["num_kv_heads"]), "--head-dim", str(k["head_dim"]),
        "--db", str(db), "--json"]))
    data = json.loads(out)
    assert data["provenance"] == "database" and data["config"] == d.config
    store.dispose()


def _tune_fake(runner, db):
    return _ok(runner.invoke(main, ["tune", "--device", "cpu", "--preset", "fake", "--db", db]))


def test_resolve_and_explain_text_and_json(runner, fake, tmp_path):
    db = str(tmp_path / "r.sqlite")
    _tune_fake(runner, db)
    kimi = ["--batch", "8", "--context", "327600", "--num-q-heads", "12", "--num-kv-heads",
            "1", "--head-dim", "576", "--head-dim-v", "512", "--db", db, "--json"]
    e = json.loads(_ok(runner.invoke(main, ["explain", "decode_attention", "--device",
                                            "amd-mi355x", *kimi])))
    assert e["provenance"] == "heuristic" and e["key"]["device"] == "amd-mi355x"
    assert [c["source"] for c in e["consulted"]][-1] == "heuristic"
    assert e["config"]["num_kv_splits"] > 1
    shipped = json.loads(_ok(runner.invoke(main, ["explain", "decode_attention", "--device",
                                                  "nvidia-h200", *kimi])))
    assert shipped["provenance"] == "table"  # tuned on the H200 and shipped in db/
    out = _ok(runner.invoke(main, ["explain", "kv_write", "--device", "amd-mi355x",
                                   "--tokens", "8", "--num-kv-heads", "16", "--head-dim",
                                   "128", "--db", db]))
    assert "consulted:" in out and "provenance: heuristic" in out and "tokens" in out
    bad = runner.invoke(main, ["resolve", "decode_attention", "--device", "nvidia-h200",
                               "--batch", "8", "--context", "64", "--num-q-heads", "12",
                               "--num-kv-heads", "5", "--head-dim", "128", "--db", db])
    assert bad.exit_code == 1 and "Error:" in bad.output
    unknown = runner.invoke(main, ["resolve", "nope", "--db", db])
    assert unknown.exit_code == 1 and "unknown op 'nope'" in unknown.output


def test_show_lists_tuned_entries(runner, fake, tmp_path):
    db = str(tmp_path / "s.sqlite")
    _tune_fake(runner, db)
    out = _ok(runner.invoke(main, ["show", "--db", db, "--op", "tune_fake"]))
    assert "3 entries" in out and "n=1024" in out and "current" in out
    # no database rows for the H200: its shipped table's entries, each with its source
    table = read_table(Path(kdispatch.__file__).parents[1] / "db" / "nvidia-h200.json")
    shipped = sum(e.op == "decode_attention" for e in table.entries)
    out = _ok(runner.invoke(main, ["show", "--db", db, "--device", "nvidia-h200", "--op",
                                   "decode_attention"]))
    assert f"(0 from the database, {shipped} from shipped tables)" in out
    assert out.count("table nvidia-h200.json") == shipped
    missing = runner.invoke(main, ["show", "--db", str(tmp_path / "none.sqlite")])
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_export_import_round_trip(runner, fake, tmp_path):
    a, b = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    table = tmp_path / "cpu-interpreter.json"
    _tune_fake(runner, a)
    out = _ok(runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o", str(table),
                                   "--db", a]))
    assert "exported 3 entries" in out
    t = read_table(table)
    assert t.device.key == "cpu-interpreter" and len(t.entries) == 3
    assert all(e.heuristic_us is not None for e in t.entries)
    out = _ok(runner.invoke(main, ["import", str(table), "--db", b]))
    assert "imported 3 entries" in out
    sa, sb = Store(a), Store(b)
    key = lambda r: (r.op, r.key_digest)  # noqa: E731
    assert sorted((key(r), r.config, r.median_us) for r in sa.best()) == \
        sorted((key(r), r.config, r.median_us) for r in sb.best())
    assert "imported 0 entries" in _ok(runner.invoke(main, ["import", str(table), "--db", b]))
    empty = runner.invoke(main, ["export", "--device", "nvidia-h200", "-o",
                                 str(tmp_path / "x.json"), "--db", a])
    assert empty.exit_code == 1 and "nothing exported" in empty.output
    sa.dispose()
    sb.dispose()


def test_merge_keeps_fastest_and_reports_conflicts(runner, fake, tmp_path):
    db = str(tmp_path / "m.sqlite")
    _tune_fake(runner, db)
    path_a = tmp_path / "a.json"
    _ok(runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o", str(path_a),
                             "--db", db]))
    a = read_table(path_a)
    e0 = a.entries[0]
    other = {**e0.config, "block": 2 if e0.config["block"] != 2 else 4}
    faster = e0.model_copy(update={"config": other, "median_us": e0.median_us / 2})
    b1 = a.entries[1].config["block"]
    slower = a.entries[1].model_copy(update={"config": {**a.entries[1].config,
                                                        "block": 32 if b1 != 32 else 2},
                                             "median_us": a.entries[1].median_us * 2})
    b = a.model_copy(update={"entries": [faster, slower, a.entries[2]]})
    path_b = tmp_path / "b.json"
    path_b.write_text(b.model_dump_json())
    out = _ok(runner.invoke(main, ["merge", str(path_a), str(path_b), "-o",
                                   str(tmp_path / "c.json")]))
    assert "2 conflicts" in out and out.count("conflict:") == 2
    merged = {json.dumps(e.key, sort_keys=True): e for e in read_table(tmp_path / "c.json")
              .entries}
    assert merged[json.dumps(e0.key, sort_keys=True)].config == other
    assert merged[json.dumps(a.entries[1].key, sort_keys=True)].config == a.entries[1].config
    other_dev = a.model_copy(update={"device": kdispatch.Device.from_key("nvidia-h200")})
    (tmp_path / "h.json").write_text(other_dev.model_dump_json())
    bad = runner.invoke(main, ["merge", str(path_a), str(tmp_path / "h.json"), "-o",
                               str(tmp_path / "d.json")])
    assert bad.exit_code == 1 and "cannot merge" in bad.output


def test_doctor_reports_device_db_tables_and_misses(runner, fake, tmp_path, monkeypatch):
    db = str(tmp_path / "d.sqlite")
    out = _ok(runner.invoke(main, ["doctor", "--db", db]))
    assert "no database file yet" in out and "torch" in out and "triton" in out
    _tune_fake(runner, db)
    Store(db).record_miss("tune_fake", {**fakeops.SPEC.key(
        kdispatch.Device.interpreter(), {"n": 7}).model_dump(mode="json")})
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "broken.json").write_text("{not json")
    _ok(runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o",
                             str(tables / "cpu-interpreter.json"), "--db", db]))
    t = read_table(tables / "cpu-interpreter.json")
    h = t.model_copy(update={"device": kdispatch.Device.from_key("nvidia-h200"), "entries": []})
    (tables / "nvidia-h200.json").write_text(h.model_dump_json())
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tables))
    out = _ok(runner.invoke(main, ["doctor", "--db", db]))
    dev = kdispatch.Device.current()
    assert f"key={dev.key}" in out and f"cu_count={dev.cu_count}" in out
    assert "measurements=21" in out and "misses: 1 recorded, 1 not yet tuned" in out
    assert "broken.json: MALFORMED" in out
    assert "cpu-interpreter.json: 3 entries" in out
    assert "nvidia-h200.json: 0 entries" in out and "other device" in out


def test_tune_usage_errors(runner, tmp_path):
    db = str(tmp_path / "e.sqlite")
    r = runner.invoke(main, ["tune", "--device", "cpu", "--db", db])
    assert r.exit_code == 2 and "--preset" in r.output
    r = runner.invoke(main, ["tune", "--device", "cpu", "--preset", "nope", "--db", db])
    assert r.exit_code == 1 and "unknown preset 'nope'" in r.output
    r = runner.invoke(main, ["tune", "--device", "tpu", "--preset", "smoke", "--db", db])
    assert r.exit_code == 1 and "expected cpu, auto or cuda" in r.output
    r = runner.invoke(main, ["tune", "--list-presets"])
    assert "llama3-8b" in _ok(r) and "smoke" in r.output
    r = runner.invoke(main, ["tune", "--device", "cpu", "--from-misses", "--db", db])
    assert "nothing to tune" in _ok(r)
