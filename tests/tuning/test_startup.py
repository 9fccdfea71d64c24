"""What a tuning run does before its first key and after its last: compile processes forked
from a preloaded fork server with their owner's environment, started without making the
owner wait; light modules to start them (and the GPU workers) with; a run that goes on as
soon as every worker reported, without waiting for their processes' teardown."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import fakecompile
from kdispatch.tuning import pool_start
from kdispatch.tuning.compile_pool import CompilePool
from kdispatch.tuning.jobs import Job, supervise
from kdispatch.tuning.precompile import LaunchSpec

REPO = Path(__file__).resolve().parent.parent.parent


def _spec(block: int) -> LaunchSpec:
    return LaunchSpec("fakecompile", "fake_kernel", (), (("BLOCK", block),), (),
                      fakecompile.TARGET, digest=f"v{block}")


def _compile(pool: CompilePool, blocks: list[int]) -> dict:
    pool.submit([(_spec(b).digest, _spec(b)) for b in blocks])
    return pool.wait([f"v{b}" for b in blocks], timeout=120)


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


def test_pool_processes_are_forked_from_a_server_and_take_the_owners_environment(
        tmp_path, monkeypatch):
    monkeypatch.delenv(pool_start.START_ENV, raising=False)
    assert pool_start.start_method() == "forkserver"  # Linux
    first = tmp_path / "first.log"
    monkeypatch.setenv("KD_FAKE_COMPILE_LOG", str(first))
    with CompilePool(1, compiler=fakecompile.COMPILER) as pool:  # the server runs from here
        assert _compile(pool, [1])["v1"].status == "compiled"
    # a fork server's child has the server's environment: the pool hands it the owner's
    later = tmp_path / "later.log"
    monkeypatch.setenv("KD_FAKE_COMPILE_LOG", str(later))
    with CompilePool(1, compiler=fakecompile.COMPILER) as pool:
        assert _compile(pool, [2])["v2"].status == "compiled"
        pid = int(later.read_text().split()[0])
        assert _ppid(pid) != os.getpid()  # forked by the server, not by this process
    assert first.read_text().split()[1] == "1" and later.read_text().split()[1] == "2"


def test_spawn_is_still_there_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv(pool_start.START_ENV, "spawn")
    monkeypatch.setenv("KD_FAKE_COMPILE_LOG", str(tmp_path / "c.log"))
    assert pool_start.start_method() == "spawn"
    with CompilePool(1, compiler=fakecompile.COMPILER) as pool:
        assert _compile(pool, [4])["v4"].status == "compiled"
        pid = int((tmp_path / "c.log").read_text().split()[0])
        assert _ppid(pid) == os.getpid()


class _SlowProcess(mp.get_context("spawn").Process):
    """A process whose start takes a while (as the first start from a fork server waits
    for the server's imports)."""

    def start(self):
        time.sleep(1.5)
        super().start()


class _SlowStart:
    """A multiprocessing context of :class:`_SlowProcess` processes."""

    def Pipe(self, duplex=True):  # noqa: N802 - multiprocessing's name
        return mp.get_context("spawn").Pipe(duplex=duplex)

    def Process(self, *args, **kwargs):  # noqa: N802
        return _SlowProcess(*args, **kwargs)


def test_the_owner_never_waits_for_its_pool_processes_to_start(tmp_path, monkeypatch):
    monkeypatch.setenv("KD_FAKE_COMPILE_LOG", str(tmp_path / "c.log"))
    t0 = time.monotonic()
    pool = CompilePool(2, compiler=fakecompile.COMPILER, context=_SlowStart())
    try:
        assert time.monotonic() - t0 < 0.5
        pool.submit([(_spec(8).digest, _spec(8))])  # queued while the processes start
        assert time.monotonic() - t0 < 0.5
        assert pool.wait(["v8"], timeout=60)["v8"].status == "compiled"
    finally:
        pool.close()


def test_the_early_start_modules_import_neither_torch_nor_the_database():
    code = ("import sys, kdispatch.tuning.workers, kdispatch.tuning.pool_settings, "
            "kdispatch.tuning.devices, kdispatch.cli.tune; "
            "print(sorted(m for m in ('torch', 'sqlalchemy', 'kdispatch.tuning.sweep') "
            "if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_one_gpu_tune_starts_its_compile_pool_before_any_heavy_import():
    """The pool's processes start while the CLI imports torch, the database, pydantic and
    rich (the pool's creation ends the run here: no GPU is needed)."""
    code = ("import sys\n"
            "from kdispatch.tuning import compile_pool\n"
            "def created(self, *args, **kwargs):\n"
            "    print(sorted(m for m in ('torch', 'sqlalchemy', 'pydantic', 'rich', 'triton')"
            " if m in sys.modules))\n"
            "    raise SystemExit(0)\n"
            "compile_pool.CompilePool.__init__ = created\n"
            "from kdispatch.cli import main\n"
            "main(['tune', '--device', 'cuda:0', '--preset', 'smoke'])\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def reports_then_lingers(events, seconds):
    """A worker that reported its result, then takes ``seconds`` to exit."""
    events.put(("done", 0, {"measured": 3}))
    time.sleep(seconds)


def test_a_run_goes_on_once_every_worker_reported_without_waiting_for_its_exit():
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    proc = ctx.Process(target=reports_then_lingers, args=(events, 30.0))
    proc.start()
    try:
        t0 = time.monotonic()
        got = supervise([Job(0, "cpu", "interpreter", ())], [proc], events, {}, None, None,
                        None, join=False)
        assert time.monotonic() - t0 < 20
        assert proc.is_alive()
        assert got[0].ok and got[0].counts == {"measured": 3}
    finally:
        proc.terminate()
        proc.join()
