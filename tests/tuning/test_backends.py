"""Tune, resolve, show and export against each database backend (SQLite and PostgreSQL),
and two tuner processes sharing one database."""

import subprocess
from collections import Counter

from click.testing import CliRunner

import fakeops
import kdispatch
from kdispatch import dispatcher
from kdispatch.cli import main
from kdispatch.store import Store
from kdispatch.tables import read_table

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)


def test_tune_resolve_show_export(db_url, tmp_path, monkeypatch):
    fakeops.install()
    try:
        runner = CliRunner()
        res = runner.invoke(main, ["tune", "--device", "cpu", "--preset", "fake", "--op",
                                   "tune_fake", "--db", db_url])
        assert res.exit_code == 0, res.output
        monkeypatch.setenv("KDISPATCH_DB", db_url)
        dispatcher.reset()
        e = kdispatch.explain("tune_fake", device="cpu-interpreter", n=200)  # bucket 256
        assert e.provenance == "database", e.consulted
        best = {b.key["n"]: b.config for b in Store(db_url).best(op="tune_fake")}
        assert e.config.model_dump() == best[e.key.n]
        shown = runner.invoke(main, ["show", "--device", "cpu-interpreter", "--db", db_url])
        assert shown.exit_code == 0 and "tune_fake" in shown.output
        out = tmp_path / "t.json"
        exp = runner.invoke(main, ["export", "--device", "cpu-interpreter", "-o", str(out),
                                   "--db", db_url])
        assert exp.exit_code == 0, exp.output
        assert len(read_table(out).entries) == N_KEYS
    finally:
        fakeops.uninstall()


def test_two_tuner_processes_share_one_database(db_url):
    Store(db_url).dispose()
    cmd = fakeops.cli_code("tune", "--device", "cpu", "--preset", "fake", "--op", "tune_fake",
                           "--db", db_url)
    env = fakeops.subprocess_env(KD_FAKE_SLEEP="0.01")
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "locked" not in out + err
    s = Store(db_url)
    pairs = Counter((m.key_digest, m.config_digest) for m in s.measurements(op="tune_fake"))
    assert len(pairs) == N_KEYS * N_CANDS and max(pairs.values()) == 1
    best = s.best(op="tune_fake")
    assert len(best) == N_KEYS and best == s.best(op="tune_fake")
    s.dispose()
