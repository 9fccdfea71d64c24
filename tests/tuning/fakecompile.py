"""A test-only compiler for the compile pool, and the fake op with launches to compile.

``AheadSpec`` is ``fakeops``' op (``tune_fake``) that also describes its launch: one
``fake_kernel`` launch whose ``BLOCK`` constexpr is the config's block, so every config is
one kernel variant. :func:`compile` is a pool compiler driven by the environment:

- ``KD_FAKE_COMPILE_LOG``: a file that gets ``pid block`` per compile;
- ``KD_FAKE_COMPILE_SLEEP``: seconds each compile takes;
- ``KD_FAKE_COMPILE_FAIL``: a block whose compile fails with a compile error (infeasible);
- ``KD_FAKE_COMPILE_CRASH``: a block whose compile kills its process, every time;
- ``KD_FAKE_COMPILE_DIE_ONCE``: ``block:marker-file``: the first compile of that block
  kills its process (and creates the marker), later ones succeed.

The fake target below stands in for a GPU: the interpreter has nothing to compile, so the
sweep only compiles ahead when a target is given.
"""

from __future__ import annotations

import os
import time

import fakeops
import triton
import triton.language as tl

from kdispatch.launching import KernelLaunch
from kdispatch.registry import register
from kdispatch.tuning.ahead import CompileSettings
from kdispatch.tuning.precompile import LaunchSpec, Outcome

TARGET = ("cuda", 90, 32)
COMPILER = "fakecompile:compile"
SETTINGS = CompileSettings(workers=2, compiler=COMPILER, target=TARGET)


@triton.jit
def fake_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class AheadSpec(fakeops.FakeSpec):
    """The fake op, with its launch described (what a pool compiles)."""

    def launches(self, config, inputs):
        x = inputs["x"]
        return [KernelLaunch(fake_kernel, (1,), (x, x.numel()), {"BLOCK": config.block},
                             {"num_warps": 4})]


def install() -> None:
    fakeops.install()
    register(AheadSpec(), replace=True)


def _block(spec: LaunchSpec) -> int:
    return int(dict(spec.constexprs)["BLOCK"])


def compile(spec: LaunchSpec) -> Outcome:
    """The fake compiler (see the module docstring)."""
    block = _block(spec)
    log = os.environ.get("KD_FAKE_COMPILE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {block}\n")
    time.sleep(float(os.environ.get("KD_FAKE_COMPILE_SLEEP", "0") or 0))
    if str(block) == os.environ.get("KD_FAKE_COMPILE_CRASH"):
        os._exit(11)
    once = os.environ.get("KD_FAKE_COMPILE_DIE_ONCE", "")
    if once:
        b, _, marker = once.partition(":")
        if str(block) == b and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(9)
    if str(block) == os.environ.get("KD_FAKE_COMPILE_FAIL"):
        return Outcome("failed", "CompilationError: at 3:4: fake rejection", infeasible=True)
    return Outcome("compiled", seconds=0.01)


def compiled_blocks(log_path) -> list[int]:
    """The blocks the pool compiled, in order (from ``KD_FAKE_COMPILE_LOG``)."""
    if not os.path.exists(log_path):
        return []
    return [int(line.split()[1]) for line in open(log_path).read().splitlines()]


def tune_main(db: str) -> None:
    """A tuner of the fake preset that compiles ahead with this fake compiler (a child
    process of the kill and resume tests)."""
    install()
    from kdispatch.store import Store
    from kdispatch.tuning import sweep
    from kdispatch.tuning.ahead import open_pool

    dev, tdev = sweep.resolve_device("cpu")
    targets, _ = sweep.plan(dev, ["fake"])
    store = Store(db)
    with open_pool(SETTINGS, interpreter=True) as pool:
        sweep.tune(targets, device=dev, torch_device=tdev, store=store, precompile=pool,
                   target=TARGET)
    store.dispose()
