"""The command line on bad databases, typos and hostile files: every failure is one line
that names the cause (no traceback), usage errors are usage errors, and the table tools
validate what enters and leaves."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tuning"))
import fakeops  # noqa: E402

import kdispatch  # noqa: E402
from kdispatch.cli import main  # noqa: E402
from kdispatch.device import Device  # noqa: E402
from kdispatch.store import MeasurementIn, Store, toolchain_versions  # noqa: E402
from kdispatch.tables import (TABLE_FORMAT_VERSION, TableEntry, TableFile, Toolchain,  # noqa: E402
                              read_table, write_table)

KV_ARGS = ["--tokens", "1", "--num-kv-heads", "8", "--head-dim", "128"]


def one_line_error(result, *needles: str) -> str:
    out = result.output.strip()
    assert result.exit_code == 1, (result.exit_code, out, result.exception)
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    for n in needles:
        assert n in out, (n, out)
    return out


# -- 8: every command on every kind of bad database ------------------------------------------
def _garbage(tmp_path: Path) -> str:
    p = tmp_path / "garbage.sqlite"
    p.write_bytes(os.urandom(8192))
    return str(p)


def _directory(tmp_path: Path) -> str:
    p = tmp_path / "a-directory.sqlite"
    p.mkdir()
    return str(p)


def _read_only(tmp_path: Path) -> str:
    p = tmp_path / "ro.sqlite"
    Store(str(p)).dispose()
    return f"sqlite:///file:{p}?mode=ro&uri=true"


def _dropped_table(tmp_path: Path) -> str:
    p = tmp_path / "dropped.sqlite"
    Store(str(p)).dispose()
    con = sqlite3.connect(p)
    con.execute("DROP TABLE kd_measurements")
    con.commit()
    con.close()
    return str(p)


def _closed_port(tmp_path: Path) -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"postgresql+psycopg://u:p@127.0.0.1:{port}/db"


BAD_DBS = {"directory": (_directory, "directory"), "garbage": (_garbage, "garbage.sqlite"),
           "read-only": (_read_only, "ro.sqlite"), "dropped-table": (_dropped_table, "dropped"),
           "unreachable-postgresql": (_closed_port, "127.0.0.1")}
COMMANDS = {
    "tune": ["tune", "--device", "cpu", "--op", "tune_fake", "--preset", "fake"],
    "show": ["show"],
    "export": ["export", "--device", "cpu-interpreter", "-o", "OUT"],
    "import": ["import", "TABLE"],
}


# reading a read-only database is fine (test_a_read_only_database_serves_the_readers)
CASES = [(b, c) for b in BAD_DBS for c in COMMANDS
         if not (b == "read-only" and c in ("show", "export"))]


@pytest.mark.parametrize("bad,command", CASES)
def test_every_command_on_a_bad_database_fails_in_one_line(runner, fake, tmp_path, bad,
                                                          command):
    make, name = BAD_DBS[bad]
    if bad == "unreachable-postgresql":
        pytest.importorskip("psycopg")
    db = make(tmp_path)
    table = tmp_path / "t.json"
    write_table(TableFile(format_version=TABLE_FORMAT_VERSION, device=Device.interpreter(),
                          toolchain=Toolchain(**toolchain_versions()), created="x",
                          entries=[]), table)
    args = [a.replace("OUT", str(tmp_path / "o.json")).replace("TABLE", str(table))
            for a in COMMANDS[command]]
    r = runner.invoke(main, [*args, "--db", db])
    one_line_error(r, "database", name)


def test_a_read_only_database_serves_the_readers(runner, fake, tmp_path):
    db = tmp_path / "ro.sqlite"
    store = Store(str(db))
    e = _entry(16, 1.0)
    store.record(MeasurementIn(op="tune_fake", key=e["key"], config=e["config"],
                               source_hash=e["source_hash"], status="ok", verified=True,
                               median_us=1.0))
    store.dispose()
    url = f"sqlite:///file:{db}?mode=ro&uri=true"
    r = runner.invoke(main, ["show", "--db", url, "--op", "tune_fake"])
    assert r.exit_code == 0 and "(1 from the database" in r.output
    r = runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o",
                             str(tmp_path / "o.json"), "--db", url])
    assert r.exit_code == 0 and "exported 1 entries" in r.output


def test_a_full_disk_fails_the_tuner_in_one_line(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: SQLite's writes fail with EFBIG."""
    db = tmp_path / "full.sqlite"

    def limit() -> None:
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    proc = subprocess.run(fakeops.cli_code("tune", "--device", "cpu", "--preset", "fake",
                                           "--db", str(db)),
                          env=fakeops.subprocess_env(), capture_output=True, text=True,
                          timeout=300, preexec_fn=limit)
    err = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "full.sqlite" in err.splitlines()[-1], err


def test_a_silent_postgresql_server_fails_the_cli_in_one_line(runner, tmp_path):
    pytest.importorskip("psycopg")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # accepts (the kernel does) and never answers
    try:
        t0 = time.monotonic()
        r = runner.invoke(main, ["show", "--db",
                                 f"postgresql+psycopg://u:p@127.0.0.1:{srv.getsockname()[1]}/d"])
        one_line_error(r, "database", "127.0.0.1")
        assert time.monotonic() - t0 < 30
    finally:
        srv.close()


def test_rows_that_are_not_json_objects_are_skipped_by_show_and_export(runner, fake,
                                                                       tmp_path):
    db = tmp_path / "rows.sqlite"
    store = Store(str(db))
    key = fakeops.SPEC.key(Device.interpreter(), {"n": 64}).model_dump(mode="json")
    for i, cfg in enumerate(({"block": 16, "num_warps": 4}, {"block": 32, "num_warps": 4})):
        store.record(MeasurementIn(op="tune_fake", key=key, config=cfg,
                                   source_hash=fakeops.SPEC.source_hash(), status="ok",
                                   verified=True, median_us=1.0 + i))
    con = sqlite3.connect(db)
    con.execute("UPDATE kd_measurements SET config_json = ? WHERE median_us = 1.0",
                ("[" * 50 + "]" * 50,))
    con.commit()
    con.close()
    out = runner.invoke(main, ["show", "--db", str(db), "--op", "tune_fake"])
    assert out.exit_code == 0 and "1 database rows were unreadable" in out.output
    r = runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o",
                             str(tmp_path / "o.json"), "--db", str(db)])
    assert r.exit_code == 0, r.output
    (e,) = read_table(tmp_path / "o.json").entries
    assert e.config["block"] == 32  # the readable row


# -- 8: usage errors and messages that name the option ---------------------------------------
def test_a_missing_option_is_a_usage_error_naming_it(runner):
    r = runner.invoke(main, ["resolve", "kv_write", "--device", "nvidia-h200",
                             "--tokens", "1", "--head-dim", "128"])
    assert r.exit_code == 2 and "--num-kv-heads" in r.output and "KeyError" not in r.output


def test_a_bad_value_keeps_its_reason_and_names_the_option(runner):
    r = runner.invoke(main, ["resolve", "kv_write", "--device", "nvidia-h200", "--tokens",
                             "0", "--num-kv-heads", "8", "--head-dim", "128"])
    one_line_error(r, "tokens", "greater than or equal to 1")
    r = runner.invoke(main, ["resolve", "kv_write", "--device", "nvidia-h200", "--dtype",
                             "int8", *KV_ARGS])
    assert r.exit_code == 2 and "--dtype" in r.output


def test_strict_mode_prints_the_miss(runner, monkeypatch, tmp_path):
    monkeypatch.setenv("KDISPATCH_STRICT", "1")
    r = runner.invoke(main, ["resolve", "kv_write", "--device", "amd-mi355x", *KV_ARGS,
                             "--db", str(tmp_path / "none.sqlite")])
    one_line_error(r, "KDISPATCH_STRICT", "kv_write", "amd-mi355x")


def test_tune_from_misses_refuses_a_key_too_large_to_allocate(runner, tmp_path):
    db = tmp_path / "m.sqlite"
    op = kdispatch.get_op("decode_attention")
    key = op.key(Device.interpreter(), dict(batch=1 << 20, context=1 << 30, num_q_heads=64,
                                            num_kv_heads=64, head_dim=512)).model_dump(mode="json")
    Store(str(db)).record_miss("decode_attention", key)
    r = runner.invoke(main, ["tune", "--device", "cpu", "--from-misses", "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "refused" in r.output and "GiB" in r.output and "nothing to tune" in r.output


# -- 9: typos ---------------------------------------------------------------------------------
def test_tune_of_an_unknown_op_fails(runner, tmp_path):
    r = runner.invoke(main, ["tune", "--device", "cpu", "--op", "nosuch", "--preset", "smoke",
                             "--db", str(tmp_path / "x.sqlite")])
    one_line_error(r, "unknown op 'nosuch'")


def test_show_of_an_unknown_device_fails(runner, tmp_path):
    r = runner.invoke(main, ["show", "--device", "nvidia-h20",
                             "--db", str(tmp_path / "none.sqlite")])
    one_line_error(r, "unknown device key 'nvidia-h20'", "nvidia-h200")
    r = runner.invoke(main, ["show", "--op", "decode_atention"])
    one_line_error(r, "unknown op 'decode_atention'")


# -- 7: doctor on FIFOs and device links ----------------------------------------------------
def test_doctor_skips_fifos_and_device_files(runner, tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "nvidia-h200.json")
    os.symlink("/dev/zero", tmp_path / "amd-mi300x.json")
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    t0 = time.monotonic()
    r = runner.invoke(main, ["doctor", "--db", str(tmp_path / "none.sqlite")])
    assert r.exit_code == 0, r.output
    assert time.monotonic() - t0 < 30
    assert r.output.count("not a regular file") == 2


# -- 5: the table tools validate what enters and leaves --------------------------------------
def _fake_table(path: Path, entries: list[dict], device=None) -> None:
    write_table(TableFile(format_version=TABLE_FORMAT_VERSION,
                          device=device or Device.interpreter(),
                          toolchain=Toolchain(**toolchain_versions()), created="2026-11-30",
                          entries=[TableEntry(**e) for e in entries]), path)


def _entry(block, us, n=64, device=None):
    dev = device or Device.interpreter()
    return dict(op="tune_fake", key=fakeops.SPEC.key(dev, {"n": n}).model_dump(mode="json"),
                config={"block": block, "num_warps": 4}, source_hash=fakeops.SPEC.source_hash(),
                median_us=us)


def test_imported_timings_never_outrank_a_measured_row(runner, fake, tmp_path):
    db = tmp_path / "i.sqlite"
    store = Store(str(db))
    e = _entry(16, 5.0)
    store.record(MeasurementIn(op="tune_fake", key=e["key"], config=e["config"],
                               source_hash=e["source_hash"], status="ok", verified=True,
                               median_us=5.0))
    _fake_table(tmp_path / "t.json", [_entry(32, 0.001)])
    r = runner.invoke(main, ["import", str(tmp_path / "t.json"), "--db", str(db)])
    assert r.exit_code == 0 and "imported 1 entries" in r.output
    (best,) = Store(str(db)).best(op="tune_fake")
    assert best.config["block"] == 16 and not best.imported  # measured here wins
    r = runner.invoke(main, ["import", str(tmp_path / "t.json"), "--db",
                             str(tmp_path / "j.sqlite"), "--as-measured"])
    assert r.exit_code == 0


def test_import_refuses_invalid_entries_and_exits_non_zero(runner, fake, tmp_path):
    _fake_table(tmp_path / "t.json", [_entry(16, 1.0), _entry(24, 1.0), _entry(32, 0.0)])
    r = runner.invoke(main, ["import", str(tmp_path / "t.json"), "--db",
                             str(tmp_path / "i.sqlite")])
    assert r.exit_code == 1
    assert "imported 1 entries" in r.output and "2 refused" in r.output
    assert "no positive measured time" in r.output


def test_merge_validates_keeps_zero_times_and_refuses_other_devices(runner, fake, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _fake_table(a, [_entry(16, 0.0), _entry(24, 1.0, n=256)])  # block 24: not in the space
    _fake_table(b, [_entry(32, 3.0)])
    r = runner.invoke(main, ["merge", str(a), str(b), "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 1 and "1 refused" in r.output
    (kept,) = read_table(tmp_path / "m.json").entries
    assert kept.config["block"] == 16 and kept.median_us == 0.0  # 0.0 us is a time, not "none"
    h = tmp_path / "h.json"
    _fake_table(h, [_entry(16, 1.0, device=Device.from_key("nvidia-h200"))],
                device=Device.from_key("nvidia-h200"))
    r = runner.invoke(main, ["merge", str(a), str(h), "-o", str(tmp_path / "x.json")])
    one_line_error(r, "cannot merge")


def test_export_passes_over_an_invalid_best_and_exports_the_next_valid(runner, fake, tmp_path):
    db = tmp_path / "e.sqlite"
    store = Store(str(db))
    for block, us in ((24, 0.5), (16, 2.0)):  # the fastest row's block is not a valid config
        e = _entry(block, us)
        store.record(MeasurementIn(op="tune_fake", key=e["key"], config=e["config"],
                                   source_hash=e["source_hash"], status="ok", verified=True,
                                   median_us=us))
    r = runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o",
                             str(tmp_path / "o.json"), "--db", str(db)])
    assert r.exit_code == 1 and "exported 1 entries" in r.output and "passed over" in r.output
    (e,) = read_table(tmp_path / "o.json").entries
    assert e.config["block"] == 16


# -- 6: a database replaced during a tune ----------------------------------------------------
@pytest.mark.parametrize("how", ["delete", "rename-over"])
def test_a_database_replaced_during_a_tune_fails_loudly(tmp_path, how):
    db = tmp_path / "t.sqlite"
    env = fakeops.subprocess_env(KD_FAKE_SLEEP="0.1")
    proc = subprocess.Popen(fakeops.cli_code("tune", "--device", "cpu", "--preset", "fake",
                                             "--db", str(db)),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if db.exists():
                try:
                    con = sqlite3.connect(db)
                    n = con.execute("select count(*) from kd_measurements").fetchone()[0]
                    con.close()
                except sqlite3.Error:
                    n = 0
                if n >= 3:
                    break
        if how == "delete":
            db.unlink()
        else:
            other = tmp_path / "other.sqlite"
            Store(str(other)).dispose()
            os.replace(other, db)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    last = out.strip().splitlines()[-1]
    assert "t.sqlite" in last and ("replaced" in last or "gone" in last), out[-2000:]
    assert "Traceback" not in out
