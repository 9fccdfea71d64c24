"""Several devices of one host: ``tune --device cpu,cpu`` (and ``--device all`` on GPUs).

The CPU tests run the CLI in a child process with the fake op installed; the fake op's spec
is pickled to the spawned workers (by reference to ``fakeops``/this module, both on the
child's PYTHONPATH). ``KD_FAKE_LOG`` records which process ran which (n, block).
"""

from __future__ import annotations

import json
import os
import re
import pickle
import subprocess
from collections import Counter

import pytest

import fakeops
from kdispatch.device import Device
from kdispatch.store import MeasurementIn, Store, digest
from kdispatch.tuning import parallel, sweep
from kdispatch.tuning.jobs import FED

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)
KEYS_N = (64, 256, 1024)  # the fake preset's keys (round-robin: worker 0 gets 64 and 1024)


class FlakySpec(fakeops.FakeSpec):
    """The fake op with a bug that only the key n=1024 hits (so only worker 0 fails)."""

    def launch(self, config, x):
        if x.numel() == 1024 and config.block == fakeops.BUGGY:
            raise TypeError("a bug only n=1024 reaches")
        return super().launch(config, x)


@pytest.fixture(autouse=True)
def fake_op():
    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


def _cli(db, *extra, flaky=False, device="cpu,cpu"):
    argv = fakeops.cli_code("tune", "--device", device, "--preset", "fake", "--op", "tune_fake",
                            "--db", db, *extra)
    if flaky:  # register the flaky spec over the fake one before the CLI runs
        argv[-1] = argv[-1].replace(
            "fakeops.install();", "fakeops.install(); import test_parallel; "
            "from kdispatch.registry import register; "
            "register(test_parallel.FlakySpec(), replace=True);")
    return argv


def _pairs(m):
    return json.loads(m.key_json)["n"], json.loads(m.config_json)["block"]


def _log(path):
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory):
    """One ``--device cpu,cpu`` run of the fake preset, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("parallel")
    db, log = str(tmp / "two.sqlite"), tmp / "runs.log"
    fakeops.install()
    r = subprocess.run(_cli(db), env=fakeops.subprocess_env(KD_FAKE_LOG=str(log)),
                       capture_output=True, text=True, timeout=180)
    return r, db, log


def test_two_cpu_workers_tune_every_key_exactly_once(two_worker_run):
    r, db, log = two_worker_run
    assert r.returncode == 0, r.stderr
    s = Store(db)
    try:
        rows = s.measurements(op="tune_fake")
        pairs = Counter(_pairs(m) for m in rows)
        assert set(pairs) == {(n, b) for n in KEYS_N for b in fakeops.BLOCKS}
        assert max(pairs.values()) == 1  # every (key, config) exactly once
        runs = s.runs()
        assert [x.status for x in runs] == ["done", "done"]
        assert len({x.pid for x in runs}) == 2
        # keys are handed out whole: every key's rows come from one worker's run
        run_of_key = {}
        for m in rows:
            run_of_key.setdefault(json.loads(m.key_json)["n"], set()).add(m.run_id)
        assert sorted(run_of_key) == sorted(KEYS_N)
        assert all(len(r) == 1 for r in run_of_key.values())
    finally:
        s.dispose()
    # the op ran only in the worker processes (never the parent), no key in both
    ran = _log(log)
    pids = {pid for pid, _, _ in ran}
    assert pids <= {x.pid for x in runs} and os.getpid() not in pids
    by_pid = {pid: {n for p, n, _ in ran if p == pid} for pid in pids}
    assert sum(len(v) for v in by_pid.values()) == N_KEYS  # no key ran in two workers
    # the summary is the single-device table over every key
    out = r.stdout
    assert "tuning summary" in out and "2 workers: cpu, cpu" in out
    for n in KEYS_N:
        assert f"n={n} " in out
    assert f"measured {N_KEYS * N_CANDS} candidates, 0 already in the database (2 workers)" \
        in out


def test_summary_matches_a_single_device_summary(two_worker_run):
    _, db, _ = two_worker_run
    s = Store(db)
    try:
        dev = Device.interpreter()
        targets, _ = sweep.plan(dev, ["fake"])
        summaries = sweep.summarize(s, dev, targets)
        assert [x.key["n"] for x in summaries] == list(KEYS_N)
        assert all((x.ok, x.rejected, x.infeasible) == (N_CANDS - 2, 1, 1) for x in summaries)
        assert all(x.best_us and x.heuristic_us for x in summaries)
    finally:
        s.dispose()


def test_identical_devices_merge_into_one_entry_and_device_keys_never_mix(two_worker_run,
                                                                         tmp_path):
    _, src, _ = two_worker_run
    db = str(tmp_path / "merge.sqlite")
    s = Store(db)
    try:
        src_store = Store(src)
        rows = src_store.measurements(op="tune_fake")
        src_store.dispose()
        # shards of identical devices: each key's rows split over two worker runs
        dev = Device.interpreter()
        run_a, run_b = s.start_run(dev, {"tune_fake": "fakehash0001"}), \
            s.start_run(dev, {"tune_fake": "fakehash0001"})
        seen: dict[str, int] = {}
        for i, m in enumerate(rows):
            nth = seen[m.key_digest] = seen.get(m.key_digest, -1) + 1  # alternate per key
            s.record(MeasurementIn(
                op=m.op, key=json.loads(m.key_json), config=json.loads(m.config_json),
                source_hash=m.source_hash, status=m.status, verified=m.verified,
                is_heuristic=m.is_heuristic, is_baseline=m.is_baseline,
                median_us=None if m.median_us is None else 100.0 + i),
                run_a if nth % 2 else run_b)
        best = s.best(device_key=dev.key, op="tune_fake")
        assert len(best) == N_KEYS  # one entry per key, whichever worker measured it
        for b in best:
            mine = [m for m in s.measurements("tune_fake", dev.key, b.key_digest)
                    if m.status == "ok" and m.verified and not m.is_baseline]
            assert {m.run_id for m in s.measurements("tune_fake", dev.key, b.key_digest)} \
                == {run_a, run_b}
            assert b.median_us == min(m.median_us for m in mine)  # fastest verified wins
        before = [(b.key_digest, b.config, b.median_us) for b in best]
        targets, _ = sweep.plan(dev, ["fake"])
        summary_before = sweep.summarize(s, dev, targets)

        # rows of another device key, faster, for the same shapes
        h200 = Device.from_key("nvidia-h200")
        for t in sweep.plan(h200, ["fake"])[0]:
            s.record(MeasurementIn(op="tune_fake", key=t.key, config={"block": 2,
                                                                      "num_warps": 4},
                                   source_hash="fakehash0001", status="ok", verified=True,
                                   median_us=0.001))
        assert [(b.key_digest, b.config, b.median_us)
                for b in s.best(device_key=dev.key, op="tune_fake")] == before
        assert sweep.summarize(s, dev, targets) == summary_before
        other = s.best(device_key="nvidia-h200", op="tune_fake")
        assert len(other) == N_KEYS and all(b.median_us == 0.001 for b in other)
        assert all(b.key["device"] == "nvidia-h200" for b in other)
    finally:
        s.dispose()


def test_a_failing_worker_is_reported_by_device_after_the_others_finish(tmp_path):
    db, log = str(tmp_path / "flaky.sqlite"), tmp_path / "runs.log"
    r = subprocess.run(_cli(db, flaky=True), env=fakeops.subprocess_env(KD_FAKE_LOG=str(log)),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"1 of 2 tuning workers failed \(worker [01] on cpu failed: TypeError: "
                     r"a bug only n=1024 reaches\)", r.stderr), r.stderr
    assert "Traceback" in r.stderr  # the worker's own traceback, for debugging
    assert "tuning summary" in r.stdout  # what was committed is still summarized
    s = Store(db)
    try:
        runs = {x.pid: x.status for x in s.runs()}
        assert sorted(runs.values()) == ["done", "failed"]
        got = Counter(json.loads(m.key_json)["n"] for m in s.measurements(op="tune_fake"))
        # the other keys were finished (by either worker); the worker that took n=1024 kept
        # the configs it measured before the bug
        assert got[256] == N_CANDS and got[64] == N_CANDS
        assert 0 < got[1024] < N_CANDS
    finally:
        s.dispose()
    # rerunning without the bug resumes: only n=1024's remaining configs are measured
    r = subprocess.run(_cli(db), env=fakeops.subprocess_env(), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    assert f"measured {N_CANDS - got[1024]} candidates" in r.stdout


def test_parse_devices():
    assert parallel.parse_devices("cpu,cpu") == ["cpu", "cpu"]
    assert parallel.parse_devices(" cuda:1 , cuda:0") == ["cuda:1", "cuda:0"]
    assert parallel.is_multi_device("all") and parallel.is_multi_device("cpu,cpu")
    assert not parallel.is_multi_device("cuda:0")
    with pytest.raises(sweep.TuningError, match="do not mix"):
        parallel.parse_devices("cpu,cuda:0")
    with pytest.raises(sweep.TuningError, match="listed twice"):
        parallel.parse_devices("cuda:0,cuda:0")
    with pytest.raises(sweep.TuningError, match="expected cpu or cuda:N"):
        parallel.parse_devices("cpu,tpu:0")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(sweep.TuningError, match="no CUDA"):
            parallel.parse_devices("all")


def test_different_devices_form_separate_groups_whose_keys_never_mix(tmp_path):
    h100, h200 = Device.from_key("nvidia-h100"), Device.from_key("nvidia-h200")
    groups = parallel.group_devices([("cuda:0", h100), ("cuda:1", h200), ("cuda:2", h100)])
    assert [(g.device.key, g.names) for g in groups] == [
        ("nvidia-h100", ("cuda:0", "cuda:2")), ("nvidia-h200", ("cuda:1",))]
    s = Store(str(tmp_path / "plan.sqlite"))
    runs = [parallel.GroupRun(g, parallel.plan_targets(s, g.device, ["fake"], None)[0])
            for g in groups]
    jobs = parallel.make_jobs(runs)  # on demand: a group's devices share its key list
    assert [(j.device_name, j.device_key, [t.key["n"] for t in j.targets], j.group, j.shared)
            for j in jobs] == [
        ("cuda:0", "nvidia-h100", [64, 256, 1024], 0, True),
        ("cuda:2", "nvidia-h100", [64, 256, 1024], 0, True),
        ("cuda:1", "nvidia-h200", [64, 256, 1024], 1, False)]
    fixed = parallel.make_jobs(runs, on_demand=False)  # round-robin shards
    assert [(j.device_name, [t.key["n"] for t in j.targets]) for j in fixed] == [
        ("cuda:0", [64, 1024]), ("cuda:2", [256]), ("cuda:1", [64, 256, 1024])]
    for j in jobs + fixed:
        assert {t.key["device"] for t in j.targets} == {j.device_key}
    # and a worker refuses keys of another device rather than tuning them into its table
    if os.environ.get("TRITON_INTERPRET") == "1":
        with pytest.raises(sweep.TuningError, match="key is for device 'nvidia-h200'"):
            parallel.run_shard(jobs[2].targets[:1], "cpu", s.url, {}, pickle.dumps([]))
        assert s.counts()["measurements"] == 0
    s.dispose()


def test_claims_hand_each_key_to_one_worker_and_tune_skips_the_others(tmp_path):
    import multiprocessing as mp

    claims = mp.get_context("spawn").Array("b", 3)
    a, b = parallel.claimer(claims), parallel.claimer(claims)
    assert [a(0), b(0), b(1), a(1), a(2)] == [True, False, True, False, True]
    # in one tune(): keys another worker claimed are skipped, the rest tuned
    dev, tdev = sweep.resolve_device("cpu")
    s = Store(str(tmp_path / "claims.sqlite"))
    try:
        targets, _ = sweep.plan(dev, ["fake"])
        taken = {1}
        res = sweep.tune(targets, device=dev, torch_device=tdev, store=s,
                         claim=lambda i: i not in taken)
        got = {json.loads(m.key_json)["n"] for m in s.measurements(op="tune_fake")}
        assert res.keys == N_KEYS - 1 and got == set(KEYS_N) - {targets[1].key["n"]}
    finally:
        s.dispose()


def test_runtime_registered_ops_are_shipped_to_workers_and_builtins_are_not():
    payload = pickle.loads(parallel.extra_specs(["tune_fake", "kv_write"]))
    assert [pickle.loads(v).name for kind, v in payload if kind == "op"] == ["tune_fake"]
    assert pickle.loads(parallel.extra_specs(["kv_write"])) == []


def test_failure_message_names_each_failed_device():
    results = [parallel.WorkerResult(0, "cuda:0", counts={"measured": 3}),
               parallel.WorkerResult(1, "cuda:1", error="RuntimeError: CUDA error: ECC")]
    msg = parallel.failure_message(results)
    assert msg.startswith("1 of 2 tuning workers failed (worker 1 on cuda:1 failed: "
                          "RuntimeError: CUDA error: ECC)")
    assert parallel.failure_message(results[:1]) is None
    assert parallel.totals(results) == (3, 0, False)


@pytest.mark.gpu
def test_all_gpus_tune_the_smoke_preset_once(tmp_path):
    """``--device all`` on every GPU of the host: each key once, one table, every worker ran."""
    import torch

    n_gpus = torch.cuda.device_count()
    db = str(tmp_path / "gpus.sqlite")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(fakeops.REPO), env.get("PYTHONPATH", "")])
    code = ("from kdispatch.cli import main; main(['tune', '--device', 'all', '--preset', "
            f"'smoke', '--max-candidates', '3', '--db', {db!r}], prog_name='kdispatch')")
    r = subprocess.run([fakeops.sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = Store(db)
    try:
        dev = Device.from_torch(torch.device("cuda", 0))
        targets, _ = sweep.plan(dev, ["smoke"])
        rows = s.measurements()
        pairs = Counter((m.op, m.key_digest, m.config_digest) for m in rows)
        assert max(pairs.values()) == 1
        assert {(m.op, m.key_digest) for m in rows} == {(t.op, digest(t.key)) for t in targets}
        assert {m.device_key for m in rows} == {dev.key}
        runs = s.runs()
        assert len(runs) == min(n_gpus, len(targets)) and all(x.status == "done" for x in runs)
        assert len(s.best(device_key=dev.key)) == len(targets)
        assert "tuning summary" in r.stdout
    finally:
        s.dispose()


def _busy(path):
    """Per worker pid: its launches' (start, end) intervals."""
    out: dict[int, list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        pid, t0, t1 = line.split()
        out.setdefault(int(pid), []).append((float(t0), float(t1)))
    return out


def _overlap(a, b):
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_two_workers_time_at_the_same_time_and_report_where_their_time_went(tmp_path):
    """Two workers, each launch a 50 ms sleep (a stand-in for a GPU that is busy while the
    host waits): their launches overlap in time (the workers are processes started before
    planning, nothing serializes them), and the summary says when each started and how
    long it was busy."""
    db, times = str(tmp_path / "two.sqlite"), tmp_path / "times.log"
    r = subprocess.run(_cli(db), env=fakeops.subprocess_env(KD_FAKE_SLEEP="0.05",
                                                             KD_FAKE_TIMES=str(times)),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    busy = _busy(times)
    assert len(busy) == 2, busy
    a, b = busy.values()
    alone = min(sum(e - s for s, e in a), sum(e - s for s, e in b))
    # serialized workers would overlap by ~0; each worker's launches mostly run while the
    # other's do (the shorter worker's launches overlap the other's for at least a third)
    spans = [[(min(s for s, _ in x), max(e for _, e in x))] for x in (a, b)]
    assert _overlap(*spans) >= 0.5 * min(x[0][1] - x[0][0] for x in spans), spans
    assert _overlap(a, b) >= alone / 3, (_overlap(a, b), alone)
    out = " ".join(r.stdout.split())
    assert re.search(r"start-up [\d.]+ s before the first key", out), out
    assert re.search(r"workers \(s from the start\): cpu started [\d.]+, device ready "
                     r"[\d.]+, first key [\d.]+, busy [\d.]+ \(GPU", out), out


def test_a_device_that_cannot_be_set_up_fails_the_run_in_one_line(tmp_path):
    """The workers set up their devices before anything is planned; one that cannot (no
    such GPU here) stops the run with its reason, one line, nothing tuned."""
    db = str(tmp_path / "none.sqlite")
    r = subprocess.run(_cli(db, device="cuda:62,cuda:63"), env={
        **fakeops.subprocess_env(), "TRITON_INTERPRET": ""}, capture_output=True, text=True,
        timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "cuda:" in errors[0], r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_groups_of_warm_workers_claim_keys_in_their_own_slice_of_one_register():
    import multiprocessing as mp

    claims = mp.get_context("spawn").Array("b", 8)
    g0, g1 = parallel.claimer(claims), parallel.claimer(claims, offset=3)
    assert g0(0) and g1(0) and not g0(0) and not g1(0)  # key 0 of each group, once each
    fed = parallel.claimer(claims, FED, offset=3)
    assert fed(1) and not fed(1) and g1(1)  # fed ahead, then still claimable for timing
    assert list(claims[:5]) == [1, 0, 0, 1, 3]


def test_ops_that_ask_to_be_timed_first_lead_the_plan(tmp_path):
    """The writer's keys (kernels that compile in a fraction of a second) are timed before
    decode's, each op's keys in preset order: the GPU starts while the pool compiles the
    decode kernels."""
    from kdispatch.tuning.plan import plan

    s = Store(f"sqlite:///{tmp_path / 'order.sqlite'}")
    dev = Device.from_key("nvidia-h200")
    planned, _ = plan(dev, ["llama3-8b"])
    targets, _ = parallel.plan_targets(s, dev, ["llama3-8b"], None)
    ops = [t.op for t in targets]
    first_decode = ops.index("decode_attention")
    assert set(ops[:first_decode]) == {"kv_write"} and "kv_write" not in ops[first_decode:]
    assert sorted(targets, key=lambda t: planned.index(t)) == planned  # same keys
    for op in ("kv_write", "decode_attention"):
        assert [t for t in targets if t.op == op] == [t for t in planned if t.op == op]
    assert planned[0].op == "decode_attention"  # the preset itself lists decode first
