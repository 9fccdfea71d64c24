"""``kdispatch tune --ray``: shards as Ray tasks on a local cluster (the interpreter device).

The CLI runs in a child process (with the fake op installed and ``fakeops`` on PYTHONPATH,
which the local Ray cluster's workers inherit); it starts a local cluster with no address.
``KD_FAKE_LOG`` records which worker process ran which (n, block); ``TuningRun.pid`` says
which worker committed which rows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner

import fakeops
from kdispatch.cli import main
from kdispatch.store import Store

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)
KEYS_N = (64, 256, 1024)
SHARD0 = {64, 1024}  # round-robin over two shards: shard 0 has two keys, shard 1 one


@pytest.fixture(autouse=True)
def fake_op():
    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


def _cli(db):
    return fakeops.cli_code("tune", "--ray", "--device", "cpu", "--shards", "2", "--preset",
                            "fake", "--op", "tune_fake", "--db", db)


def _pair(m):
    return json.loads(m.key_json)["n"], json.loads(m.config_json)["block"]


def _log(path):
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    r = CliRunner().invoke(main, ["tune", "--ray", "--device", "cpu", "--preset", "fake",
                                  "--db", str(tmp_path / "x.sqlite")])
    assert r.exit_code == 1
    assert 'pip install "kdispatch[ray]"' in r.output
    r = CliRunner().invoke(main, ["tune", "--device", "cpu", "--shards", "2", "--preset",
                                  "fake", "--db", str(tmp_path / "x.sqlite")])
    assert r.exit_code == 2 and "--shards" in r.output


def test_ray_rejects_a_device_list(tmp_path):
    pytest.importorskip("ray")
    r = CliRunner().invoke(main, ["tune", "--ray", "--device", "cuda:0,cuda:1", "--preset",
                                  "fake", "--db", str(tmp_path / "x.sqlite")])
    assert r.exit_code == 1 and "with --ray, use auto" in r.output


def test_two_ray_shards_tune_every_key_exactly_once(tmp_path):
    pytest.importorskip("ray")
    db, log = str(tmp_path / "ray.sqlite"), tmp_path / "runs.log"
    r = subprocess.run(_cli(db), env=fakeops.subprocess_env(KD_FAKE_LOG=str(log)),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    s = Store(db)
    try:
        rows = s.measurements(op="tune_fake")
        pairs = Counter(_pair(m) for m in rows)
        assert set(pairs) == {(n, b) for n in KEYS_N for b in fakeops.BLOCKS}
        assert max(pairs.values()) == 1
        runs = s.runs()
        assert [x.status for x in runs] == ["done", "done"]
        keys_by_run = {x.id: {json.loads(m.key_json)["n"] for m in rows if m.run_id == x.id}
                       for x in runs}
        assert sorted(map(sorted, keys_by_run.values())) == [[64, 1024], [256]]
        assert r.returncode == 0 and os.getpid() not in {x.pid for x in runs}
    finally:
        s.dispose()
    ran = _log(log)
    by_pair = defaultdict(set)
    for pid, n, b in ran:
        by_pair[(n, b)].add(pid)
    assert all(len(p) == 1 for p in by_pair.values())  # no candidate ran in two tasks
    assert "2 Ray shards on a local cluster" in r.stdout and "tuning summary" in r.stdout
    for n in KEYS_N:
        assert f"n={n} " in r.stdout
    assert f"measured {N_KEYS * N_CANDS} candidates" in r.stdout


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_killed_ray_worker_is_retried_and_resumes(tmp_path):
    pytest.importorskip("ray")
    db, log = str(tmp_path / "kill.sqlite"), tmp_path / "runs.log"
    env = fakeops.subprocess_env(KD_FAKE_LOG=str(log), KD_FAKE_SLEEP="0.05")
    proc = subprocess.Popen(_cli(db), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    s = Store(db)
    victim = None
    try:
        t0 = time.monotonic()
        while victim is None:  # the worker of shard 0 (two keys), a few rows in
            assert time.monotonic() - t0 < 120, "no shard-0 progress"
            assert proc.poll() is None, proc.communicate()
            rows = s.measurements(op="tune_fake")
            for run in s.runs():
                mine = [m for m in rows if m.run_id == run.id]
                if 3 <= len(mine) < 2 * N_CANDS - 4 and \
                        {json.loads(m.key_json)["n"] for m in mine} <= SHARD0:
                    victim = run
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        while _alive(victim.pid):
            time.sleep(0.02)
        committed_by_victim = {_pair(m) for m in s.measurements(op="tune_fake")
                               if m.run_id == victim.id}
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, out + err
        rows = s.measurements(op="tune_fake")
        runs = s.runs()
    finally:
        if proc.poll() is None:
            proc.kill()
        s.dispose()
    # nothing lost: every (key, config) exactly once, the victim's rows kept
    pairs = Counter(_pair(m) for m in rows)
    assert set(pairs) == {(n, b) for n in KEYS_N for b in fakeops.BLOCKS}
    assert max(pairs.values()) == 1
    assert committed_by_victim == {_pair(m) for m in rows if m.run_id == victim.id}
    # the task was retried: a third run finished shard 0 after the victim's (never finished)
    assert len(runs) == 3
    assert {x.status for x in runs if x.id == victim.id} == {"killed"}  # seen dead
    retry = [x for x in runs if x.id > victim.id and x.pid != victim.pid and
             {json.loads(m.key_json)["n"] for m in rows if m.run_id == x.id} <= SHARD0
             and any(m.run_id == x.id for m in rows)]
    assert len(retry) == 1 and retry[0].status == "done"
    # nothing committed was measured twice: the retry ran none of the victim's rows,
    # only (at most) the candidate in flight when it was killed and its key's first timed
    # candidate, whose row waits for the key's end to be timed again
    ran = _log(log)
    ran_by_others = {(n, b) for pid, n, b in ran if pid != victim.pid}
    assert not (ran_by_others & committed_by_victim)
    in_flight = {(n, b) for pid, n, b in ran if pid == victim.pid} - committed_by_victim
    assert len(in_flight) <= 2 and len({n for n, _ in in_flight}) <= 1
    assert f"measured {N_KEYS * N_CANDS - len(committed_by_victim)} candidates" in out
