"""The sweep compiling ahead in a pool (the fake op with a described launch, the fake
compiler, a stand-in GPU target): what the rows say, what a dying pool process or a killed
tuner leaves behind, the budget, two workers sharing one pool, and how many candidates a
run measures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from click.testing import CliRunner

import fakecompile
import fakeops
from kdispatch.cli import main
from kdispatch.device import Device
from kdispatch.store import Store
from kdispatch.tuning import parallel, sweep
from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.estimate import SpaceRule, estimate_seconds, space_sizes
from kdispatch.tuning.jobs import DeviceGroup, GroupRun

N_KEYS, N_CANDS = 3, len(fakeops.BLOCKS)
REJECTION = "CompilationError: at 3:4: fake rejection"


@pytest.fixture(autouse=True)
def ahead_op():
    fakecompile.install()
    yield
    fakeops.uninstall()


@pytest.fixture
def clog(tmp_path, monkeypatch):
    path = tmp_path / "compiles.log"
    monkeypatch.setenv("KD_FAKE_COMPILE_LOG", str(path))
    return path


def _tune(store, pool=None, **kw):
    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    return sweep.tune(targets, device=dev, torch_device=tdev, store=store, precompile=pool,
                      target=fakecompile.TARGET if pool is not None else None, **kw)


def _rows(store):
    return {(json.loads(m.key_json)["n"], json.loads(m.config_json)["block"]): m
            for m in store.measurements(op="tune_fake")}


def _pairs(store):
    return Counter((m.key_digest, m.config_digest) for m in store.measurements(op="tune_fake"))


def test_a_compiler_rejection_is_infeasible_and_the_rest_is_as_without_a_pool(
        tmp_path, store, clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_FAIL", "4")
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        res = _tune(store, pool)
    plain = Store(f"sqlite:///{tmp_path / 'plain.sqlite'}")
    _tune(plain)
    rows, base = _rows(store), _rows(plain)
    plain.dispose()
    assert res.measured == N_KEYS * N_CANDS and set(rows) == set(base)
    for (n, block), m in rows.items():
        if block == 4:
            assert (m.status, m.verified, m.error) == ("infeasible", False, REJECTION)
            assert base[n, block].status == "ok"
        else:  # the verdicts of everything else are the plain run's
            assert (m.status, m.error) == (base[n, block].status, base[n, block].error)
    # one compile per variant: the three keys' launches specialize alike
    assert sorted(fakecompile.compiled_blocks(clog)) == sorted(fakeops.BLOCKS)
    assert res.throughput.pool["failed"] == 1 and res.throughput.pool["submitted"] == N_CANDS


def test_the_pool_run_never_launches_what_the_compiler_rejected(tmp_path, store, clog,
                                                                monkeypatch):
    launched = tmp_path / "launches.log"
    monkeypatch.setenv("KD_FAKE_LOG", str(launched))
    monkeypatch.setenv("KD_FAKE_COMPILE_FAIL", "4")
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        _tune(store, pool)
    blocks = [int(line.split()[2]) for line in launched.read_text().splitlines()]
    assert 4 not in blocks and set(blocks) == set(fakeops.BLOCKS) - {4}


def test_a_killed_pool_process_loses_and_duplicates_no_rows(tmp_path, store, clog,
                                                           monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_DIE_ONCE", f"16:{tmp_path / 'died'}")
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        res = _tune(store, pool)
    assert (tmp_path / "died").exists()
    pairs = _pairs(store)
    assert len(pairs) == N_KEYS * N_CANDS and max(pairs.values()) == 1
    assert all(m.status == "ok" for (n, b), m in _rows(store).items() if b == 16)
    assert res.throughput.pool["restarts"] == 1
    assert fakecompile.compiled_blocks(clog).count(16) == 2  # started, killed, compiled again


def test_a_kernel_that_crashes_the_compiler_every_time_is_infeasible(store, clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_CRASH", "2")
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        _tune(store, pool)
    rows = _rows(store)
    assert len(rows) == N_KEYS * N_CANDS
    for (n, block), m in rows.items():
        if block == 2:
            assert m.status == "infeasible" and m.error.startswith("CompilerCrash")


def test_the_budget_stops_cleanly_while_kernels_compile_and_a_rerun_resumes(store, clog,
                                                                            monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "3")
    phases = []
    with CompilePool(1, compiler=fakecompile.COMPILER) as pool:
        t0 = time.monotonic()
        res = _tune(store, pool, budget_minutes=0.02,
                    progress=lambda p: phases.append(p.phase))
        took = time.monotonic() - t0
    assert res.stopped == "budget" and took < 20
    assert "compiling" in phases
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "0")
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        again = _tune(store, pool)
    assert again.stopped is None and len(_pairs(store)) == N_KEYS * N_CANDS
    assert max(_pairs(store).values()) == 1


def test_a_tuner_killed_while_compiling_resumes_without_losing_or_repeating_rows(tmp_path,
                                                                                 clog):
    db = str(tmp_path / "killed.sqlite")
    env = fakeops.subprocess_env(KD_FAKE_COMPILE_LOG=str(clog), KD_FAKE_COMPILE_SLEEP="2")
    code = [sys.executable, "-c", f"import fakecompile; fakecompile.tune_main({db!r})"]
    proc = subprocess.Popen(code, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not (clog.exists() and clog.read_text().strip()):
        assert proc.poll() is None and time.monotonic() - t0 < 120, "no compile started"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # in the compile phase: the pool is compiling
    proc.wait()
    pool_pids = {int(line.split()[0]) for line in clog.read_text().splitlines()}
    t0 = time.monotonic()
    while any(_alive(p) for p in pool_pids):  # orphans finish their item and exit
        assert time.monotonic() - t0 < 30, "pool processes outlived their tuner"
        time.sleep(0.1)
    env["KD_FAKE_COMPILE_SLEEP"] = "0"
    done = subprocess.run(code, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    s = Store(db)
    try:
        pairs = _pairs(s)
        assert len(pairs) == N_KEYS * N_CANDS and max(pairs.values()) == 1
    finally:
        s.dispose()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_workers_share_one_pool_and_compile_each_variant_once(tmp_path, clog):
    store = Store(f"sqlite:///{tmp_path / 'two.sqlite'}")
    dev = Device.interpreter()
    targets, _ = sweep.plan(dev, ["fake"])
    seen = []
    try:
        results = parallel.tune_local([GroupRun(DeviceGroup(dev, ("cpu", "cpu")), targets)],
                                      store, compile_settings=fakecompile.SETTINGS,
                                      on_compile=seen.append)
        pairs = _pairs(store)
    finally:
        store.dispose()
    assert all(r.ok for r in results), [r.error for r in results]
    assert len(pairs) == N_KEYS * N_CANDS and max(pairs.values()) == 1
    assert sorted(fakecompile.compiled_blocks(clog)) == sorted(fakeops.BLOCKS)
    assert seen and seen[-1].compiled == N_CANDS
    parts = [r.counts["throughput"] for r in results]
    assert sum(p["candidates"] for p in parts) == N_KEYS * N_CANDS


# -- how many candidates -------------------------------------------------------------------------
def test_the_full_space_is_chosen_when_its_estimate_fits_the_budget():
    dev = Device.from_key("nvidia-h200")
    targets, _ = sweep.plan(dev, ["kimi-k3-tp8"])
    size = space_sizes(targets)
    assert size.keys == len(targets) and size.capped < size.full
    est = estimate_seconds(size.full, compile_workers=15)
    full, note = SpaceRule("auto", est / 60 * 1.1, compile_workers=15).apply(
        targets, interpreter=False)
    assert all(t.max_candidates is None for t in full) and note.startswith("full search")
    capped, note = SpaceRule("auto", est / 60 * 0.9, compile_workers=15).apply(
        targets, interpreter=False)
    assert capped == targets and "--max-candidates all" in note
    slow, _ = SpaceRule("auto", est / 60 * 1.1, compile_workers=0).apply(
        targets, interpreter=False)  # compiling at launch takes longer
    assert slow == targets
    assert SpaceRule("auto").apply(targets, interpreter=True)[0] == targets
    assert SpaceRule("capped").apply(targets, interpreter=False) == (targets, None)
    assert all(t.max_candidates is None
               for t in SpaceRule("full").apply(targets, interpreter=True)[0])


def test_cli_lists_preset_sizes_and_checks_its_new_options():
    r = CliRunner().invoke(main, ["tune", "--list-presets", "--device", "nvidia-h200"])
    assert r.exit_code == 0, r.output
    # llama3-8b: 10 decode and 4 KV-write shapes, each with a bf16 and an fp8 cache
    assert "llama3-8b" in r.output and "on nvidia-h200: 28 keys" in r.output
    assert "in the full valid space" in r.output
    for bad in (["--max-candidates", "0"], ["--max-candidates", "many"],
                ["--compile-workers", "-1"], ["--compile-workers", "4", "--ray"]):
        r = CliRunner().invoke(main, ["tune", "--device", "cpu", "--preset", "fake", *bad])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()[-1]) < 200, r.output


class _Recorder:
    """A pool that records what is submitted and answers every kernel as compiled."""

    def __init__(self):
        self.items = {}

    def submit(self, items):
        self.items.update(items)

    def prioritize(self, ids):
        pass

    def wait(self, ids, timeout=None):
        from kdispatch.tuning.precompile import Outcome

        return {v: Outcome("compiled") for v in ids if v in self.items}

    def stats(self):
        return None


def test_every_candidate_of_the_builtin_ops_is_described_for_the_pool():
    """The built-in ops describe every candidate's launches (none left to the JIT but a
    baseline without a kernel), and candidates of one op share kernels across keys."""
    import torch

    from kdispatch.registry import get_op
    from kdispatch.tuning.ahead import CompileAhead
    from kdispatch.tuning.plan import candidate_list
    from kdispatch.store import digest

    dev = Device.interpreter()
    targets, _ = sweep.plan(dev, ["smoke"])
    work, n = [], 0
    for ki, t in enumerate(targets):
        op = get_op(t.op)
        key = op.parse_key(t.key)
        todo = [(digest(c.model_dump(mode="json")), c) for c, _ in candidate_list(op, key)]
        work.append((ki, op, key, todo))
        n += len(todo)
    pool = _Recorder()
    ahead = CompileAhead(pool, fakecompile.TARGET, torch.device("cpu"))
    ahead.submit(work)
    left = [cfg for ki, _, _, todo in work for d, cfg in todo if not ahead._ids.get((ki, d))]
    # only the KV write's indexed baseline launches no kernel (two torch assignments)
    assert n > 40 and [getattr(c, "variant", None) for c in left] == ["indexed", "indexed"]
    assert all(ahead.ready(ki, d).status == "go" for ki, _, _, todo in work for d, _ in todo)
    assert 0 < len(pool.items) < n  # shared variants are submitted once
    assert {s.module for s in pool.items.values()} >= {
        "kdispatch.kernels.kv_write.kernel", "kdispatch.kernels.decode_attention.kernels"}
