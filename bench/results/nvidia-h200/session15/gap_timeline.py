"""Session 15: the first seconds of a one-GPU tune again (issue 20), now with every key's
describe. Runs ``kdispatch tune`` in this process, like session 14's tune_timeline.py,
with timestamps (seconds from this script's start) on: the compile pool's creation, its
processes' first "ready", its first submits and outcomes, the first keys' inputs, the
first candidates; and one line per key described for the pool (``CompileAhead._describe``:
its key, the op, where it was described -- own, top_up or ready --, when it started and
how long it took). It ends with the describes summed per place, the longest five, and
``END_EPOCH`` (``time.time()`` once the tune returned) for the caller to time the exit.

``--wait old`` runs the tune with the previous ``CompileAhead.ready`` (before branch
tune-gap: it describes later keys for as long as the candidate's kernels compile, whatever
the pool has queued), for an A/B on the same tree.

    python3 bench/results/nvidia-h200/session15/gap_timeline.py [--wait old] \
        --device cuda:0 --preset llama3-8b --max-candidates 6 --db /tmp/tl.sqlite
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
#: (start, seconds, key, op, where, candidates described with kernels)
DESCRIBES: list[tuple[float, float, int, str, str, int]] = []
PLACE = ["own"]
WAIT = ["new"]


def mark(what: str) -> None:
    EVENTS.append((time.monotonic() - T0, what))


def patch_pool() -> None:
    """The compile pool (imports neither torch nor Triton: patched before the CLI runs)."""
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


def old_ready(self, key_index, digest, deadline=None, on_wait=None):
    """``CompileAhead.ready`` as it was on main at c27e3b1 (session 14)."""
    from kdispatch.tuning import ahead as A

    ids = self._ids.get((key_index, digest))
    if not ids or self.pool is None:
        return A.Ready("go")
    need = len(set(ids))
    t0 = time.monotonic()
    shown = t0 - A.POLL_S
    described = self.stats.describe_s
    got = self.pool.wait(ids, timeout=0)
    if len(got) < need:
        self.pool.prioritize(ids)
    try:
        while len(got) < need:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return A.Ready("budget")
            if time.monotonic() - t0 > A.STALL_S:
                break
            if on_wait is not None and time.monotonic() - shown >= A.POLL_S:
                on_wait()
                shown = time.monotonic()
            if self.feed(deadline):
                got = self.pool.wait(ids, timeout=0)
            else:
                got = self.pool.wait(ids, timeout=A.POLL_S if left is None
                                     else min(A.POLL_S, left))
    finally:
        self._open.difference_update(got)
        self.stats.wait_s += time.monotonic() - t0 - (self.stats.describe_s - described)
    for vid in ids:
        o = got.get(vid)
        if o is not None and o.status == "failed" and o.infeasible:
            return A.Ready("infeasible", o.error)
    return A.Ready("go")


def patch_ahead(wait: str) -> None:
    """Every describe, with where it happened; the wait policy to run."""
    from kdispatch.tuning import ahead

    cls = ahead.CompileAhead
    describe, top_up, ready = cls._describe, cls.top_up, cls.ready
    if wait == "old":
        ready = old_ready
    waits = [0]

    def described(self, key_index, now):
        op = self._work[key_index][0].name
        t = time.monotonic()
        had = len(self._ids)
        describe(self, key_index, now)
        DESCRIBES.append((t - T0, time.monotonic() - t, key_index, op, PLACE[0],
                          len(self._ids) - had))

    def topped(self, deadline=None):
        PLACE[0] = "top_up"
        try:
            return top_up(self, deadline)
        finally:
            PLACE[0] = "own"

    def waited(self, key_index, digest, deadline=None, on_wait=None):
        PLACE[0] = "ready"
        waits[0] += 1
        n, t = len(DESCRIBES), time.monotonic()
        try:
            return ready(self, key_index, digest, deadline, on_wait)
        finally:
            PLACE[0] = "own"
            if waits[0] <= 2:
                mark(f"ready #{waits[0]} (key {key_index}): {time.monotonic() - t:.2f} s, "
                     f"{len(DESCRIBES) - n} keys described in it")

    cls._describe, cls.top_up, cls.ready = described, topped, waited


def patch_sweep(sweep) -> None:
    """The sweep's key inputs and first candidates, every describe (when the CLI imports
    the sweep: importing kdispatch.tuning.ahead earlier would delay the pool's start)."""
    mark("kdispatch.tuning.sweep imported")
    from kdispatch.tuning import inputs

    patch_ahead(WAIT[0])
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


def report() -> None:
    for t, what in EVENTS:
        print(f"{t:7.2f} s  {what}", flush=True)
    print("describes (start s, took s, key, op, where, candidates with kernels):")
    for start, took, ki, op, where, n in DESCRIBES:
        print(f"  {start:7.2f}  {took:6.3f}  key {ki:3d}  {op:18s} {where:7s} {n}")
    places: dict[str, list[float]] = {}
    for _, took, _, _, where, _ in DESCRIBES:
        places.setdefault(where, []).append(took)
    print("describing per place: " + "; ".join(
        f"{w} {len(v)} keys {sum(v):.2f} s" for w, v in sorted(places.items())))
    top = sorted(DESCRIBES, key=lambda d: -d[1])[:5]
    print("longest describes: " + "; ".join(
        f"key {ki} {op} {took:.2f} s ({where} at {start:.2f})"
        for start, took, ki, op, where, _ in top))


def main() -> None:
    mark("script start")
    args = sys.argv[1:]
    if args[:1] == ["--wait"]:
        WAIT[0], args = args[1], args[2:]
    patch_pool()
    sys.meta_path.insert(0, _AfterSweep())
    from kdispatch.cli import main as cli

    mark(f"kdispatch.cli imported (wait policy: {WAIT[0]})")
    try:
        cli(["tune", *args], prog_name="kdispatch", standalone_mode=False)
    finally:
        mark("tune returned")
        end = time.time()
        report()
        print(f"END_EPOCH {end:.3f}", flush=True)


if __name__ == "__main__":
    main()
