"""A test-only op for the tuner: configs that are right, wrong, infeasible or buggy.

``tune_fake``: out = 2 * x. Config ``block``:

- 8 gives a wrong output (rejected by verification);
- 64 raises triton's OutOfResources (infeasible);
- 32 raises TypeError when ``KD_FAKE_BUG=1`` (a programming error: must propagate).

``KD_FAKE_SLEEP`` (seconds) slows every run (kill/resume and concurrency tests);
``KD_FAKE_LOG`` (a file) gets one line ``pid n block`` per run; ``KD_FAKE_TIMES`` (a file)
one line ``pid start end`` per run (``time.monotonic``, system-wide: overlap tests).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import ClassVar

import torch
from pydantic import Field
from triton.runtime.errors import OutOfResources

from kdispatch.buckets import pow2_bucket
from kdispatch.opdef import Op, OpConfig, OpKey, OpTuning
from kdispatch.registry import register, unregister
from kdispatch.tuning.presets import Preset, PresetEntry, register_preset, unregister_preset

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BLOCKS = (1, 2, 4, 8, 16, 32, 64)
WRONG, INFEASIBLE, BUGGY = 8, 64, 32


class FakeKey(OpKey):
    n: int = Field(ge=1, le=1 << 20)


class FakeConfig(OpConfig):
    block: int = 16


class FakeSpec(Op, OpTuning):
    name: ClassVar[str] = "tune_fake"
    key_model = FakeKey
    config_model = FakeConfig

    @property
    def tuning(self):  # one object plays both faces
        return self

    def memo_key(self, args):
        return (args.get("device"), args["n"])

    def device_of(self, args):
        return args.get("device")

    def key(self, device, args):
        n = int(args["n"])
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        return FakeKey(**OpKey.device_fields(device), n=pow2_bucket(n))

    def heuristic(self, key):
        return FakeConfig(block=16)

    def baseline(self, key):
        return FakeConfig(block=1)

    def candidates(self, key):
        return [FakeConfig(block=b) for b in BLOCKS]

    def is_valid(self, key, config):
        return config.block in BLOCKS

    def launch(self, config, x):
        sleep = float(os.environ.get("KD_FAKE_SLEEP", "0") or 0)
        t0 = time.monotonic()
        if sleep:
            time.sleep(sleep)
        times = os.environ.get("KD_FAKE_TIMES")
        if times:
            with open(times, "a") as f:
                f.write(f"{os.getpid()} {t0} {time.monotonic()}\n")
        log = os.environ.get("KD_FAKE_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {x.numel()} {config.block}\n")
        if config.block == INFEASIBLE:
            raise OutOfResources(300000, 232448, "shared memory")
        if config.block == BUGGY and os.environ.get("KD_FAKE_BUG") == "1":
            raise TypeError("a bug in the launcher")
        out = x * 2
        if config.block == WRONG:
            out[0] += 1.0
        return out

    def make_inputs(self, key, device, seed):
        g = torch.Generator().manual_seed(seed)
        return {"x": (torch.rand(key.n, generator=g) + 0.5).to(device)}

    def run(self, config, inputs):
        return self.launch(config, **inputs)

    def reference(self, inputs):
        return inputs["x"].float() * 2

    def tolerance(self, key):
        return (1e-6, 0.0)

    def bytes_moved(self, key):
        return key.n * 8

    def source_hash(self):
        return "fakehash0001"


SPEC = FakeSpec()
PRESET = Preset("fake", "test-only fake op keys", tuple(
    PresetEntry("tune_fake", {"n": n}) for n in (60, 64, 256, 1000)))  # 60 and 64 share a key


def install() -> None:
    register(SPEC, replace=True)
    register_preset(PRESET, replace=True)


def uninstall() -> None:
    unregister(SPEC.name)
    unregister_preset(PRESET.name)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child python that can import kdispatch and this module."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    env["TRITON_INTERPRET"] = "1"
    env["COLUMNS"] = "250"  # a pipe's width: keep rich from wrapping the lines tests read
    env.update(extra)
    return env


def cli_code(*args: str) -> list[str]:
    """argv running the kdispatch CLI in a child with the fake op installed."""
    code = ("import fakeops; fakeops.install(); from kdispatch.cli import main; "
            f"main({list(args)!r}, prog_name='kdispatch')")
    return [sys.executable, "-c", code]
