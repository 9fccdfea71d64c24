"""The fake op with a launch to compile ahead, for the compile pool's tests.

``AheadSpec`` is ``fakeops``' op (``tune_fake``) that also describes its launch: one
``fake_kernel`` launch whose ``BLOCK`` constexpr is the config's block, so every config is
one kernel variant. The pool compiles them with ``fakecompiler.compile`` (a module that
imports nothing heavy, so pool processes start at once). The fake target stands in for a
GPU: the interpreter has nothing to compile, so the sweep only compiles ahead when a target
is given.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

import fakeops

from kdispatch.launching import KernelLaunch
from kdispatch.registry import register
from kdispatch.tuning.ahead import CompileSettings

TARGET = ("cuda", 90, 32)
COMPILER = "fakecompiler:compile"
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
