"""The sweep driver with a fake op: verification, infeasibility, resume, budget, kill, races."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter

import pytest

import fakeops
from kdispatch.device import Device
from kdispatch.store import Store, digest
from kdispatch.tuning import sweep
from kdispatch.tuning.presets import Preset, PresetEntry, register_preset, unregister_preset

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)


@pytest.fixture(autouse=True)
def fake_op():
    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


def _tune(store, **kw):
    dev, tdev = sweep.resolve_device("cpu")
    targets, notes = sweep.plan(dev, ["fake"])
    return sweep.tune(targets, device=dev, torch_device=tdev, store=store, **kw)


def test_plan_dedupes_bucketed_keys_and_shards():
    dev = Device.interpreter()
    targets, notes = sweep.plan(dev, ["fake"])
    assert [t.key["n"] for t in targets] == [64, 256, 1024]  # 60 and 64 share a bucket
    assert notes == []
    shards = sweep.shard(targets, 2)
    assert sorted(t.key["n"] for s in shards for t in s) == [64, 256, 1024]
    assert [len(s) for s in shards] == [2, 1]
    with pytest.raises(ValueError, match="at least one shard"):
        sweep.shard(targets, 0)


def test_plan_skips_optional_entries_with_a_note_and_fails_required_ones():
    register_preset(Preset("fake-opt", "x", (PresetEntry("tune_fake", {"n": 0}, optional=True,
                                                         note="n=0 unsupported"),
                                             PresetEntry("tune_fake", {"n": 4}))))
    register_preset(Preset("fake-bad", "x", (PresetEntry("tune_fake", {"n": 0}),)))
    try:
        targets, notes = sweep.plan(Device.interpreter(), ["fake-opt"])
        assert [t.key["n"] for t in targets] == [4]
        assert len(notes) == 1 and "n: must be >= 1" in notes[0]
        with pytest.raises(sweep.TuningError, match="fake-bad"):
            sweep.plan(Device.interpreter(), ["fake-bad"])
    finally:
        unregister_preset("fake-opt")
        unregister_preset("fake-bad")


def test_candidate_list_puts_heuristic_and_baseline_first_and_caps(fake_op):
    key = fake_op.key(Device.interpreter(), {"n": 64})
    full = sweep.candidate_list(fake_op, key)
    assert [c.block for c, _ in full][:2] == [16, 1]
    assert [r for _, r in full] == ["heuristic"] + ["candidate"] * (N_CANDS - 1)
    assert len({c.block for c, _ in full}) == N_CANDS  # heuristic not duplicated
    capped = sweep.candidate_list(fake_op, key, cap=4)
    assert len(capped) == 4 and [c.block for c, _ in capped][:2] == [16, 1]


def test_baseline_outside_the_space_is_timed_but_never_best(store, monkeypatch):
    """A baseline the op keeps out of its candidates (kv_write's indexed writes) is
    measured for comparison and recorded as such, but can never become a best config."""
    spec = fakeops.SPEC
    outside = fakeops.FakeConfig(block=max(fakeops.BLOCKS) * 2)
    monkeypatch.setattr(type(spec), "baseline", lambda self, key: outside)
    monkeypatch.setattr(type(spec), "is_valid", lambda self, key, c: True)
    key = spec.key(Device.interpreter(), {"n": 64})
    roles = {c.block: r for c, r in sweep.candidate_list(spec, key)}
    assert roles[outside.block] == "baseline" and roles[16] == "heuristic"
    _tune(store)
    rows = store.measurements(op="tune_fake")
    base = [m for m in rows if json.loads(m.config_json)["block"] == outside.block]
    assert base and all(m.is_baseline and m.status == "ok" and m.verified for m in base)
    # even when the baseline is by far the fastest, it is never the best config
    from sqlalchemy import update
    from kdispatch.store import Measurement
    with store.engine.begin() as conn:
        conn.execute(update(Measurement).where(Measurement.is_baseline.is_(True))
                     .values(median_us=1e-6))
    best = store.best(op="tune_fake")
    assert len(best) == N_KEYS and all(b.config["block"] != outside.block for b in best)


def test_wrong_candidate_is_rejected_and_never_best_infeasible_is_recorded(store):
    res = _tune(store)
    assert res.measured == N_KEYS * N_CANDS and res.stopped is None
    rows = store.measurements(op="tune_fake")
    by_block = {}
    for m in rows:
        by_block.setdefault(json.loads(m.config_json)["block"], []).append(m)
    assert {m.status for m in by_block[fakeops.WRONG]} == {"rejected"}
    assert all(not m.verified and m.median_us is None and m.max_error == pytest.approx(1.0)
               for m in by_block[fakeops.WRONG])
    assert {m.status for m in by_block[fakeops.INFEASIBLE]} == {"infeasible"}
    assert all("OutOfResources" in m.error for m in by_block[fakeops.INFEASIBLE])
    ok = [m for m in rows if m.status == "ok"]
    assert len(ok) == N_KEYS * (N_CANDS - 2) and all(m.verified and m.median_us > 0 for m in ok)
    assert {json.loads(m.config_json)["block"] for m in rows if m.is_heuristic} == {16}
    best = store.best(device_key="cpu-interpreter", op="tune_fake")
    assert len(best) == N_KEYS
    assert all(b.config["block"] not in (fakeops.WRONG, fakeops.INFEASIBLE) for b in best)
    for s in res.summaries:
        assert s.best_config["block"] != fakeops.WRONG
        assert s.heuristic_us is not None and s.speedup == pytest.approx(
            s.heuristic_us / s.best_us)
        assert (s.ok, s.rejected, s.infeasible) == (N_CANDS - 2, 1, 1)
    assert [r.status for r in store.runs()] == ["done"]


def test_rerun_measures_nothing_and_progress_reports(store):
    seen = []
    _tune(store, progress=seen.append)
    assert seen[-1].done == seen[-1].total == N_KEYS * N_CANDS
    assert seen[-1].eta_s == 0
    ids = sorted(m.id for m in store.measurements())
    res = _tune(store)
    assert res.measured == 0 and res.skipped == N_KEYS * N_CANDS  # reported as already there
    assert sorted(m.id for m in store.measurements()) == ids
    assert len(res.summaries) == N_KEYS and all(s.best_us for s in res.summaries)


def test_budget_stops_cleanly(store):
    res = _tune(store, budget_minutes=1e-9)
    assert res.stopped == "budget" and res.measured == 0
    assert store.runs()[-1].status == "stopped"
    res = _tune(store)
    assert res.measured == N_KEYS * N_CANDS


def test_programming_error_propagates(store, monkeypatch):
    monkeypatch.setenv("KD_FAKE_BUG", "1")
    with pytest.raises(TypeError, match="a bug in the launcher"):
        _tune(store)
    assert store.runs()[-1].status == "failed"
    assert not any(json.loads(m.config_json)["block"] == fakeops.BUGGY
                   for m in store.measurements())


def test_interpreter_guard(monkeypatch):
    import sys
    import types

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "kdispatch.kernels.some_kernel", types.ModuleType("x"))
    with pytest.raises(sweep.TuningError, match="compiled mode"):
        sweep.resolve_device("cpu")


def test_gpu_device_without_gpu_is_a_clear_error():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(sweep.TuningError, match="no CUDA"):
        sweep.resolve_device("cuda:0")
    with pytest.raises(sweep.TuningError, match="expected cpu, auto or cuda"):
        sweep.resolve_device("tpu")


def _tune_cmd(db, *extra):
    return fakeops.cli_code("tune", "--device", "cpu", "--preset", "fake", "--op", "tune_fake",
                            "--db", db, *extra)


def _wait_rows(db, n, proc, timeout=60):
    s = Store(db)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            if s.counts()["measurements"] >= n:
                return
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
    finally:
        s.dispose()
    raise AssertionError("tuner made no progress")


def test_kill_and_resume_loses_nothing_and_remeasures_nothing(tmp_path):
    db = str(tmp_path / "kill.sqlite")
    log = tmp_path / "runs.log"
    env = fakeops.subprocess_env(KD_FAKE_SLEEP="0.03", KD_FAKE_LOG=str(log))
    proc = subprocess.Popen(_tune_cmd(db), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    _wait_rows(db, 5, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    s = Store(db)
    first = {(m.id, m.key_digest, m.config_digest) for m in s.measurements()}
    assert 5 <= len(first) < N_KEYS * N_CANDS
    first_pid = proc.pid
    done = subprocess.run(_tune_cmd(db), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = s.measurements()
    assert len(rows) == N_KEYS * N_CANDS
    assert first <= {(m.id, m.key_digest, m.config_digest) for m in rows}  # nothing lost

    def n_block(m):
        return (json.loads(m.key_json)["n"], json.loads(m.config_json)["block"])

    committed_first = {n_block(m) for m in rows if (m.id, m.key_digest, m.config_digest) in first}
    runs = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    ran_second = {(n, b) for pid, n, b in runs if pid != first_pid}
    assert ran_second and not (ran_second & committed_first)  # nothing re-measured
    assert ran_second | committed_first == {n_block(m) for m in rows}
    assert len({m.run_id for m in rows}) == 2
    s.dispose()


def test_two_concurrent_tuners_on_one_sqlite_file(tmp_path):
    db = str(tmp_path / "race.sqlite")
    env = fakeops.subprocess_env(KD_FAKE_SLEEP="0.01")
    procs = [subprocess.Popen(_tune_cmd(db), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "database is locked" not in out + err
    s = Store(db)
    rows = s.measurements()
    pairs = Counter((m.key_digest, m.config_digest) for m in rows)
    assert len(pairs) == N_KEYS * N_CANDS and max(pairs.values()) == 1  # none lost, no dupes
    assert [r.status for r in s.runs()] == ["done", "done"]
    best = s.best(device_key="cpu-interpreter")
    assert len(best) == N_KEYS and len({b.key_digest for b in best}) == N_KEYS
    assert best == s.best(device_key="cpu-interpreter")  # one consistent answer
    s.dispose()


def test_from_misses_tunes_exactly_the_recorded_keys(tmp_path):
    db = str(tmp_path / "miss.sqlite")
    code = ("import fakeops; fakeops.install(); import kdispatch; "
            "from kdispatch import dispatcher; "
            "[kdispatch.resolve('tune_fake', device='cpu-interpreter', n=n) "
            " for n in (3, 4, 100, 100)]; dispatcher.dispatcher().flush_misses()")
    env = fakeops.subprocess_env(KDISPATCH_RECORD_MISSES="1", KDISPATCH_DB=db)
    r = subprocess.run([fakeops.sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    s = Store(db)
    misses = s.misses(device_key="cpu-interpreter")
    assert sorted(k["n"] for _, k in misses) == [4, 128]  # 3 and 4 share a bucket
    r = subprocess.run(fakeops.cli_code("tune", "--device", "cpu", "--from-misses", "--db", db),
                       env=fakeops.subprocess_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    tuned = {m.key_digest for m in s.measurements()}
    assert tuned == {digest(k) for _, k in misses}
    assert len(s.measurements()) == 2 * N_CANDS
    assert s.misses(device_key="cpu-interpreter") == []  # all marked tuned
    assert len(s.misses(include_tuned=True)) == 2
    s.dispose()


def test_capped_candidates_keep_the_ops_first_variants():
    """A capped sweep keeps the op's first-listed variants of the heuristic (for decode: its
    pdl and merge twins), then spreads the rest: an evenly sampled cap of 12 once skipped
    the pdl twin that later measured fastest at deepseek b32 x 16k."""
    from kdispatch.kernels.decode_attention import OP as DECODE

    key = DECODE.key(Device.from_key("nvidia-h200"), dict(
        batch=32, context=16384, num_q_heads=16, num_kv_heads=1, head_dim=576,
        head_dim_v=512, page_size=16))
    full = [c for c, _ in sweep.candidate_list(DECODE, key)]
    capped = [c for c, _ in sweep.candidate_list(DECODE, key, cap=12)]
    h = DECODE.heuristic(key)
    assert len(capped) == 12 and capped[0] == h and len(set(capped)) == 12
    for twin in (h.model_copy(update={"pdl": True, "merge": False}),
                 h.model_copy(update={"merge": not h.merge})):
        assert twin in capped
    assert capped[-1] in full[len(full) // 2:]  # and reaches into the far end of the list
