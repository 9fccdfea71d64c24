"""The ``kdispatch`` executable (``kdispatch.cli:run``) in a real process: once torch is
loaded it ends with ``os._exit`` after the command; its output, exit code and database
writes must be what a normal exit gives."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

ENV = {**os.environ, "TRITON_INTERPRET": "1"}
RESOLVE = ["resolve", "decode_attention", "--device", "nvidia-h200", "--batch", "8",
           "--context", "327600", "--num-q-heads", "12", "--num-kv-heads", "1",
           "--head-dim", "576", "--head-dim-v", "512"]


def kd(*args: str, **kw) -> subprocess.CompletedProcess:
    # an atexit hook that would print: skipped by the quick exit, run by a normal one
    code = ("import atexit, sys; atexit.register(lambda: print('atexit ran', file=sys.stderr))"
            "; sys.argv = ['kdispatch', *sys.argv[1:]]; from kdispatch.cli import run; run()")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, env=ENV, timeout=300, **kw)


def test_a_command_that_loads_torch_exits_quickly_with_its_output():
    r = kd(*RESOLVE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("config: {") and "provenance: table" in r.stdout
    assert "atexit ran" not in r.stderr  # the interpreter's teardown was skipped


def test_exit_codes_and_one_line_errors_survive_the_quick_exit():
    r = kd(*RESOLVE[:-2])  # decode_attention without --head-dim-v: fine (defaults)
    assert r.returncode == 0, r.stderr
    r = kd("resolve", "decode_attention", "--device", "nvidia-h200", "--batch", "0",
           "--context", "64", "--num-q-heads", "8", "--num-kv-heads", "8",
           "--head-dim", "128")
    assert r.returncode == 1 and "batch" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_without_torch_the_exit_is_normal():
    r = kd("--version")
    assert r.returncode == 0 and "kdispatch, version" in r.stdout
    assert "atexit ran" in r.stderr


def test_a_tune_quick_exit_keeps_every_row(tmp_path):
    db = tmp_path / "smoke.sqlite"
    r = kd("tune", "--device", "cpu", "--preset", "smoke", "--db", f"sqlite:///{db}")
    assert r.returncode == 0, r.stderr
    assert "measured 15 candidates" in r.stdout and "atexit ran" not in r.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from kd_measurements").fetchone()[0] == 15
