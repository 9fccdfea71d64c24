"""A test-only compiler for the compile pool, driven by the environment.

- ``KD_FAKE_COMPILE_LOG``: a file that gets ``pid block`` per compile;
- ``KD_FAKE_COMPILE_SLEEP``: seconds each compile takes;
- ``KD_FAKE_COMPILE_FAIL``: a block whose compile fails with a compile error (infeasible);
- ``KD_FAKE_COMPILE_CRASH``: a block whose compile kills its process, every time;
- ``KD_FAKE_COMPILE_DIE_ONCE``: ``block:marker-file``: the first compile of that block
  kills its process (and creates the marker), later ones succeed;
- ``KD_FAKE_COMPILE_TIMES``: a file that gets ``block n start end`` (``time.time()``) per
  compile that returns, ``n`` being the spec's ``N`` constexpr (0 without one).

The block is the spec's ``BLOCK`` constexpr (``fakecompile.AheadSpec``'s launches).
"""

from __future__ import annotations

import os
import time

from kdispatch.tuning.precompile import LaunchSpec, Outcome


def _block(spec: LaunchSpec) -> int:
    return int(dict(spec.constexprs)["BLOCK"])


def compile(spec: LaunchSpec) -> Outcome:
    """The fake compiler (see the module docstring)."""
    block = _block(spec)
    t0 = time.time()
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
    times = os.environ.get("KD_FAKE_COMPILE_TIMES")
    if times:
        with open(times, "a") as f:
            f.write(f"{block} {dict(spec.constexprs).get('N', 0)} {t0} {time.time()}\n")
    if str(block) == os.environ.get("KD_FAKE_COMPILE_FAIL"):
        return Outcome("failed", "CompilationError: at 3:4: fake rejection", infeasible=True)
    return Outcome("compiled", seconds=0.01)
