"""Faults: tuners killed at random points, truncated and garbage databases, bad tables.

The database must always open, answer queries and resume without re-measuring what was
committed; a serving process degrades to the heuristic with one warning; ``kdispatch
doctor`` names the problem.
"""

import json
import os
import random
import signal
import subprocess
import time
import warnings
from collections import Counter

import pytest
from click.testing import CliRunner

import fakeops
import kdispatch
from kdispatch import KDispatchWarning, dispatcher
from kdispatch.cli import main
from kdispatch.store import Store

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)
KILLS = 4


def _tune_cmd(db):
    return fakeops.cli_code("tune", "--device", "cpu", "--preset", "fake", "--op", "tune_fake",
                            "--db", db)


def _wait_for_more_rows(db, n, proc, timeout=60):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if os.path.exists(db):
            store = Store(db)
            try:
                if store.counts()["measurements"] > n:
                    return
            finally:
                store.dispose()
        time.sleep(0.02)
    raise AssertionError("the tuner made no progress before the kill")


def _pairs(store):
    return [(m.key_digest, m.config_digest) for m in store.measurements()]


def test_sigkill_at_random_points_then_resume(tmp_path):
    db = str(tmp_path / "kills.sqlite")
    log = tmp_path / "runs.log"
    env = fakeops.subprocess_env(KD_FAKE_SLEEP="0.03", KD_FAKE_LOG=str(log))
    rng = random.Random(1234)
    committed: set = set()
    committed_after = []  # (n, block) pairs committed when kill i happened
    killed_pids = []
    for _ in range(KILLS):
        proc = subprocess.Popen(_tune_cmd(db), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # let it commit something new, then kill at a random point (mid-candidate/commit)
        _wait_for_more_rows(db, len(committed), proc)
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_pids.append(proc.pid)
        store = Store(db)  # opens (WAL recovery) and answers queries
        pairs = _pairs(store)
        assert max(Counter(pairs).values(), default=1) == 1
        assert committed <= set(pairs)  # nothing committed was lost
        committed = set(pairs)
        committed_after.append({(json.loads(m.key_json)["n"], json.loads(m.config_json)["block"])
                                for m in store.measurements()})
        store.best(device_key="cpu-interpreter")
        store.dispose()
    final = subprocess.run(_tune_cmd(db), env=env, capture_output=True, text=True, timeout=180)
    assert final.returncode == 0, final.stderr[-2000:]
    store = Store(db)
    rows = store.measurements()
    assert len(rows) == N_KEYS * N_CANDS and committed <= set(_pairs(store))
    assert len(store.best(device_key="cpu-interpreter")) == N_KEYS
    # a (key, config) committed before a kill is never run again by a later process, and
    # at most two candidates per kill are run again: the one in flight and the key's first
    # timed one, whose row waits for the key's end to be timed a second time
    runs = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    pids = list(dict.fromkeys(pid for pid, _, _ in runs))
    ran_by: dict = {}
    for pid, n, block in runs:
        ran_by.setdefault((n, block), set()).add(pid)
    for i, pairs_then in enumerate(committed_after):
        later = set(pids[pids.index(killed_pids[i]) + 1:]) if killed_pids[i] in pids else set()
        for pair in pairs_then:
            assert not (ran_by[pair] & later), (pair, "re-measured after being committed")
    assert sum(len(p) - 1 for p in ran_by.values()) <= 2 * KILLS
    sizes = [len(c) for c in committed_after]
    assert sizes == sorted(sizes) and 0 < sizes[0] and len(set(sizes)) >= 3  # varied points
    statuses = [r.status for r in store.runs()]
    # killed runs are marked so by the next run on this host (their process is gone)
    assert statuses[-1] == "done" and statuses.count("killed") >= 1 \
        and "running" not in statuses
    store.dispose()


def _db_with_rows(path):
    fakeops.install()
    try:
        res = CliRunner().invoke(main, ["tune", "--device", "cpu", "--preset", "fake", "--op",
                                        "tune_fake", "--db", str(path)])
        assert res.exit_code == 0, res.output
    finally:
        fakeops.uninstall()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "zero-header"])
def test_damaged_database_degrades_and_doctor_names_it(tmp_path, monkeypatch, damage):
    path = tmp_path / "damaged.sqlite"
    _db_with_rows(path)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 3 or 1][:4096])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    else:
        path.write_bytes(b"\0" * 100 + data[100:])
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.remove(str(path) + suffix)
    monkeypatch.setenv("KDISPATCH_DB", str(path))
    fakeops.install()
    try:
        dispatcher.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            e = kdispatch.explain("tune_fake", device="cpu-interpreter", n=3)
            kdispatch.explain("tune_fake", device="cpu-interpreter", n=100)
        assert e.provenance == "heuristic"
        msgs = [str(w.message) for w in caught if issubclass(w.category, KDispatchWarning)]
        assert len(msgs) == 1 and "database unusable" in msgs[0]
        out = CliRunner().invoke(main, ["doctor", "--db", str(path)])
        assert "unusable" in out.output.lower() or "error" in out.output.lower(), out.output
    finally:
        fakeops.uninstall()


def test_unknown_format_version_table_degrades_and_doctor_names_it(tmp_path, monkeypatch):
    (tmp_path / "cpu-interpreter.json").write_text(json.dumps({"format_version": 7}))
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    fakeops.install()
    try:
        dispatcher.reset()
        with pytest.warns(KDispatchWarning, match="format_version 7"):
            e = kdispatch.explain("tune_fake", device="cpu-interpreter", n=3)
        assert e.provenance == "heuristic"
        out = CliRunner().invoke(main, ["doctor"])
        assert "format_version 7" in out.output, out.output
    finally:
        fakeops.uninstall()
