"""Session 14: where the first seconds of a tune go (issue 20: ~5.8 s before the first
timing at llama3-8b, 6 candidates per key). Runs ``kdispatch tune`` in this process with
timestamps (seconds from the process start) patched onto: the compile pool's creation, each
process's first "ready", the first submit, the first few outcomes; the sweep's KeyInputs
(inputs and reference made) and its first measure calls. Prints one line per event.

    python3 bench/results/nvidia-h200/session14/tune_timeline.py --preset llama3-8b \
        --max-candidates 6 --device cuda:0 --db /tmp/tl.sqlite
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import time
from pathlib import Path

T0 = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
EVENTS: list[tuple[float, str]] = []


def mark(what: str) -> None:
    EVENTS.append((time.monotonic() - T0, what))


def patch_pool() -> None:
    """The compile pool (its module imports neither torch nor Triton: patched at once, so
    the pool still starts before the CLI imports torch, as in a plain run)."""
    from kdispatch.tuning import compile_pool

    pool_init, pool_submit = compile_pool.CompilePool.__init__, compile_pool.CompilePool.submit
    pool_read, pool_finish = compile_pool.CompilePool._read, compile_pool.CompilePool._finish
    seen = {"ready": 0, "submit": 0, "done": 0}

    def init(self, *a, **k):
        mark("pool created")
        pool_init(self, *a, **k)

    def submit(self, items, *a, **k):
        items = list(items)
        seen["submit"] += 1
        if seen["submit"] <= 3:
            mark(f"pool submit #{seen['submit']} ({len(items)} kernels)")
        return pool_submit(self, items, *a, **k)

    def read(self, p):
        was = p.ready
        pool_read(self, p)
        if p.ready and not was:
            seen["ready"] += 1
            if seen["ready"] in (1, self.workers):
                mark(f"pool process ready #{seen['ready']}")

    def finish(self, vid, outcome):
        seen["done"] += 1
        if seen["done"] in (1, 2, 5, 10):
            mark(f"kernel outcome #{seen['done']} ({outcome.status}, {outcome.seconds:.2f} s)")
        return pool_finish(self, vid, outcome)

    compile_pool.CompilePool.__init__ = init
    compile_pool.CompilePool.submit = submit
    compile_pool.CompilePool._read = read
    compile_pool.CompilePool._finish = finish


def patch_sweep(sweep) -> None:
    """The sweep's key inputs and first candidates (when the CLI imports the sweep)."""
    mark("kdispatch.tuning.sweep imported")
    from kdispatch.tuning import inputs

    key_init = inputs.KeyInputs.__init__
    n_keys = [0]

    def key_inputs(self, *a, **k):
        n_keys[0] += 1
        if n_keys[0] <= 2:
            mark(f"key inputs #{n_keys[0]}: start")
        key_init(self, *a, **k)
        if n_keys[0] <= 2:
            mark(f"key inputs #{n_keys[0]}: inputs and reference made")

    inputs.KeyInputs.__init__ = key_inputs
    meas = sweep.measure
    n_meas = [0]

    def measured(*a, **k):
        n_meas[0] += 1
        if n_meas[0] <= 2:
            mark(f"candidate #{n_meas[0]}: start")
        out = meas(*a, **k)
        if n_meas[0] <= 2:
            mark(f"candidate #{n_meas[0]}: done")
        return out

    sweep.measure = measured


class _AfterSweep(importlib.abc.MetaPathFinder):
    """Patches kdispatch.tuning.sweep right after it is first executed."""

    def find_spec(self, name, path, target=None):
        if name != "kdispatch.tuning.sweep":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch_sweep(module)
        spec.loader.exec_module = exec_module
        return spec


def main() -> None:
    mark("script start")
    patch_pool()
    sys.meta_path.insert(0, _AfterSweep())
    from kdispatch.cli import main as cli

    mark("kdispatch.cli imported")

    try:
        cli(["tune", *sys.argv[1:]], prog_name="kdispatch", standalone_mode=False)
    finally:
        mark("tune returned")
        for t, what in EVENTS:
            print(f"{t:7.2f} s  {what}", flush=True)


if __name__ == "__main__":
    main()
