"""The compile pool: real kernels for an H200 without one, and the pool's own machinery
(dedup, order, failures, dying processes, shutdown) with a fake compiler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fakecompile
import jit_check
from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.precompile import LaunchSpec, TensorArg, describe

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _spec(block: int) -> LaunchSpec:
    return LaunchSpec("fakecompile", "fake_kernel", (), (("BLOCK", block),), (),
                      fakecompile.TARGET, digest=f"v{block}")


def _wait_for(pred, timeout=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def clog(tmp_path, monkeypatch):
    path = tmp_path / "compiles.log"
    monkeypatch.setenv("KD_FAKE_COMPILE_LOG", str(path))
    return path


# -- real kernels, compiled for a GPU this machine does not have ------------------------------
def test_pool_compiles_kdispatch_kernels_for_sm90_and_the_jit_only_loads_them(tmp_path):
    """Triton ships ptxas, so sm_90 compiles here; the JIT's own key, computed from the
    live tensors (one a misaligned view), finds every kernel the pool compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]))
    r = subprocess.run([sys.executable, str(HERE / "jit_check.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["launches"] == got["variants"] == 4  # the misaligned view is its own variant
    assert got["outcomes"] == ["compiled"] * 4, got["errors"]
    assert got["jit_compiled"] == 0 and got["jit_cache_hits"] == 4
    assert got["cache_files"] > 0


def test_a_kernel_the_compiler_rejects_is_an_infeasible_outcome(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    x = torch.zeros(16)
    from kdispatch.launching import KernelLaunch

    spec = describe(KernelLaunch(jit_check.bad_kernel, (1,), (x, 16)), jit_check.TARGET)
    with CompilePool(1) as pool:
        pool.submit([(spec.digest, spec)])
        out = pool.wait([spec.digest], timeout=300)[spec.digest]
    assert out.status == "failed" and out.infeasible
    assert out.error.startswith("CompilationError")


def test_describe_names_a_variant_by_triton_specialization():
    from kdispatch.launching import KernelLaunch

    def spec(x, n, block=16):
        return describe(KernelLaunch(fakecompile.fake_kernel, (1,), (x, n), {"BLOCK": block},
                                     {"num_warps": 4}), fakecompile.TARGET)

    x = torch.zeros(64)
    base = spec(x, 64)
    assert spec(torch.zeros(64), 128).digest == base.digest      # both divisible by 16
    assert spec(x, 65).digest != base.digest                     # not divisible by 16
    assert spec(x, 1).digest != base.digest                      # 1 is a constexpr
    assert spec(x[1:], 64).digest != base.digest                 # a misaligned pointer
    assert spec(x, 64, block=32).digest != base.digest
    assert base.args == (TensorArg("float32", 0), 64)
    assert spec(x[1:], 64).args[0].ptr_mod16 == 4


# -- the pool's machinery, with the fake compiler ----------------------------------------------
def test_each_variant_compiles_once_in_order_and_callbacks_see_every_outcome(clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_FAIL", "4")
    blocks = [1, 2, 4, 8, 16]
    seen = []
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        pool.submit([(_spec(b).digest, _spec(b)) for b in blocks],
                    on_done=lambda vid, o: seen.append(vid))
        pool.submit([(_spec(b).digest, _spec(b)) for b in blocks[:2]],
                    on_done=lambda vid, o: seen.append(vid))
        got = pool.wait([f"v{b}" for b in blocks], timeout=60)
        _wait_for(lambda: len(seen) == 7)
        stats = pool.stats()
    assert sorted(fakecompile.compiled_blocks(clog)) == sorted(blocks)
    assert got["v4"].status == "failed" and got["v4"].infeasible
    assert got["v4"].error.startswith("CompilationError")
    assert all(got[f"v{b}"].status == "compiled" for b in blocks if b != 4)
    assert (stats.submitted, stats.compiled, stats.failed, stats.skipped) == (5, 4, 1, 0)


def test_prioritized_items_compile_next(clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "0.3")
    blocks = [1, 2, 4, 8, 16, 32]
    with CompilePool(1, compiler=fakecompile.COMPILER) as pool:
        pool.submit([(_spec(b).digest, _spec(b)) for b in blocks])
        _wait_for(lambda: fakecompile.compiled_blocks(clog))  # the first one is in flight
        pool.prioritize(["v32", "v16"])
        pool.wait([f"v{b}" for b in blocks], timeout=60)
    assert fakecompile.compiled_blocks(clog)[1:3] == [32, 16]


def test_a_killed_process_is_replaced_and_its_item_compiled_by_another(clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "1.0")
    blocks = [1, 2, 4]
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        pool.submit([(_spec(b).digest, _spec(b)) for b in blocks])
        _wait_for(lambda: clog.exists() and clog.read_text().strip())
        pid = int(clog.read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        got = pool.wait([f"v{b}" for b in blocks], timeout=60)
        stats = pool.stats()
    assert [got[f"v{b}"].status for b in blocks] == ["compiled"] * 3
    assert stats.restarts == 1 and stats.compiled == 3
    killed = [int(line.split()[1]) for line in clog.read_text().splitlines()
              if int(line.split()[0]) == pid]
    assert len(killed) == 1  # the victim's item was compiled again, by a live process
    assert sorted(fakecompile.compiled_blocks(clog)) == sorted(blocks + killed)


def test_an_item_that_kills_every_process_is_a_failed_infeasible_compile(clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_CRASH", "2")
    with CompilePool(2, compiler=fakecompile.COMPILER) as pool:
        pool.submit([(_spec(b).digest, _spec(b)) for b in (1, 2, 4)])
        got = pool.wait(["v1", "v2", "v4"], timeout=60)
        stats = pool.stats()
    assert got["v2"].status == "failed" and got["v2"].infeasible
    assert got["v2"].error.startswith("CompilerCrash: 2 compile processes died")
    assert got["v1"].status == got["v4"].status == "compiled"
    assert stats.restarts == 2


def test_a_pool_whose_processes_cannot_start_skips_everything_and_never_hangs():
    with CompilePool(2, compiler="no_such_module_here:compile") as pool:
        pool.submit([(_spec(b).digest, _spec(b)) for b in (1, 2)])
        got = pool.wait(["v1", "v2"], timeout=120)
        pool.submit([(_spec(4).digest, _spec(4))])  # after it gave up: skipped at once
        late = pool.wait(["v4"], timeout=5)
    assert {o.status for o in got.values()} == {"skipped"}
    assert "ModuleNotFoundError" in got["v1"].error
    assert late["v4"].status == "skipped"


def test_close_abandons_queued_items_and_stops_every_process(clog, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_SLEEP", "5")
    pool = CompilePool(2, compiler=fakecompile.COMPILER)
    pool.submit([(_spec(b).digest, _spec(b)) for b in (1, 2, 4, 8)])
    _wait_for(lambda: clog.exists() and len(clog.read_text().splitlines()) == 2)
    pids = {int(line.split()[0]) for line in clog.read_text().splitlines()}
    t0 = time.monotonic()
    pool.close()
    assert time.monotonic() - t0 < 10
    got = pool.wait(["v1", "v2", "v4", "v8"], timeout=1)
    assert {o.status for o in got.values()} == {"skipped"}
    assert not any(_alive(p) for p in pids)
