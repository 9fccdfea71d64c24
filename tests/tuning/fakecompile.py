"""The fake op with a launch to compile ahead, for the compile pool's tests.

``AheadSpec`` is ``fakeops``' op (``tune_fake``) that also describes its launch: one
``fake_kernel`` launch whose ``BLOCK`` constexpr is the config's block, so every config is
one kernel variant. ``KeyedSpec`` launches ``keyed_kernel`` instead, whose ``N`` constexpr
is the key's size, so every key has kernels of its own (as real kernels specialized on a
key's shapes do); its inputs can be slow to make (``KD_FAKE_INPUTS_SLEEP`` seconds, like a
large cache drawn on the host), and ``KD_FAKE_RUN_TIMES`` (a file) gets ``time n block``
per run. The pool compiles them with ``fakecompiler.compile`` (a module that imports nothing
heavy, so pool processes start at once). The fake target stands in for a GPU: the
interpreter has nothing to compile, so the sweep only compiles ahead when a target is given.
"""

from __future__ import annotations

import os
import time

import torch
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


#: the keys ``KeyedSpec`` made inputs for in this process, in order
MADE: list[int] = []
#: keys whose next inputs fail as a GPU out of memory would (once each)
OOM_ONCE: set[int] = set()


@triton.jit
def keyed_kernel(x_ptr, n, BLOCK: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class KeyedSpec(AheadSpec):
    """The fake op with kernels of each key's own (see the module)."""

    def launches(self, config, inputs):
        x = inputs["x"]
        return [KernelLaunch(keyed_kernel, (1,), (x, x.numel()),
                             {"BLOCK": config.block, "N": x.numel()}, {"num_warps": 4})]

    def make_inputs(self, key, device, seed):
        if key.n in OOM_ONCE:
            OOM_ONCE.discard(key.n)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a fake)")
        MADE.append(key.n)
        time.sleep(float(os.environ.get("KD_FAKE_INPUTS_SLEEP", "0") or 0))
        return super().make_inputs(key, device, seed)

    def run(self, config, inputs):
        path = os.environ.get("KD_FAKE_RUN_TIMES")
        if path:
            with open(path, "a") as f:
                f.write(f"{time.time()} {inputs['x'].numel()} {config.block}\n")
        return super().run(config, inputs)


def install(keyed: bool = False) -> None:
    fakeops.install()
    register(KeyedSpec() if keyed else AheadSpec(), replace=True)


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
