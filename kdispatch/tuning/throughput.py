"""Where a tuning run's time went: compiling, the GPU, and candidates per second.

Each timing process fills a :class:`Throughput` (its GPU seconds, the kernels its own JIT
compiled, how long it described and waited for the compile pool); a run with several
workers merges them and adds the pool's own figures (:meth:`Throughput.merge`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any


def process_age() -> float | None:
    """Seconds since this process started (Linux: from ``/proc``, to 10 ms), else None.

    The start-up a user waits for (the interpreter, imports, the GPU) happens before any
    of this package's code runs, so it is read from the kernel's record of the process.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Throughput:
    """Attributes
    ----------
    wall_s : float
        The run, first key planned to the last row committed.
    gpu_s : float
        Making inputs and the reference, verifying and timing candidates, less the compile
        time of the timing process's own JIT (which without a pool happens inside them).
    candidates : int
        Candidates measured (rows written) by this run.
    pilot_only : int
        Of those, verified candidates timed by their pilot only (clearly slower than their
        key's best full measurement; :mod:`kdispatch.tuning.measure`).
    jit_compiled, jit_compile_s : int, float
        Kernels the timing process compiled itself at launch, and how long that took (with
        a pool: the kernels it missed).
    jit_loaded : int
        Kernels the timing process loaded from the Triton cache.
    describe_s, wait_s : float
        Describing candidates for the pool; waiting for it before a candidate.
    pool : dict or None
        :class:`~kdispatch.tuning.compile_pool.PoolStats` of the pool, when one ran.
    jit_names : list of str
        The kernels the timing process compiled itself (the first 20).
    start_s : float or None
        Seconds from the run's start (its process's start) to this sweep's first key:
        the start-up (imports, compile pool, GPU set-up, planning; for a worker of
        ``--device all``, also waiting for its job).
    worker_start_s, ready_s : float or None
        A worker process of ``--device all``: when it started and when its device was
        set up, in seconds from the run's start.
    first_s : float or None
        Seconds from this sweep's start to its first candidate (per-key set-up, the first
        key's inputs and its first kernels).
    store_s : float
        Seconds spent reading and committing rows between candidates.
    device : str
        The worker's device name (``cuda:0``), when it is one of several.
    """

    wall_s: float = 0.0
    gpu_s: float = 0.0
    candidates: int = 0
    pilot_only: int = 0
    jit_compiled: int = 0
    jit_compile_s: float = 0.0
    jit_loaded: int = 0
    describe_s: float = 0.0
    wait_s: float = 0.0
    pool: dict[str, Any] | None = None
    jit_names: list[str] = field(default_factory=list)
    start_s: float | None = None
    worker_start_s: float | None = None
    ready_s: float | None = None
    first_s: float | None = None
    store_s: float = 0.0
    device: str = ""
    #: the workers' own figures, when several were merged (:meth:`merge`)
    workers: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def finish(self, t0: float, candidates: int, jit: Any) -> None:
        """Close the figures of a run that started at ``t0`` (``time.monotonic``), with its
        JIT's :class:`~kdispatch.tuning.precompile.CompileCounts` (or None)."""
        self.wall_s = time.monotonic() - t0
        self.candidates = candidates
        if jit is not None:
            self.jit_compiled, self.jit_compile_s = jit.compiled, jit.seconds
            self.jit_loaded, self.jit_names = jit.cache_hits, jit.names[:20]
            self.gpu_s = max(0.0, self.gpu_s - jit.seconds)  # the JIT compiled inside verify

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Throughput:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def merge(cls, parts: list[dict[str, Any]], wall_s: float,
              pool: dict[str, Any] | None) -> Throughput:
        """Several workers' figures as one run of ``wall_s`` seconds with ``pool``."""
        out = cls(wall_s=wall_s, pool=pool)
        for p in parts:
            t = cls.from_dict(p)
            out.gpu_s += t.gpu_s
            out.candidates += t.candidates
            out.pilot_only += t.pilot_only
            out.jit_compiled += t.jit_compiled
            out.jit_compile_s += t.jit_compile_s
            out.jit_loaded += t.jit_loaded
            out.jit_names = (out.jit_names + t.jit_names)[:20]
            out.describe_s = max(out.describe_s, t.describe_s)
            out.wait_s += t.wait_s
            out.store_s += t.store_s
            out.workers.append(t.as_dict())
        starts = [t["start_s"] for t in out.workers if t.get("start_s") is not None]
        out.start_s = min(starts) if starts else None
        return out

    def worker_line(self) -> str:
        """Where each worker's time went, from the run's start (several workers only).

        >>> Throughput(workers=[dict(device="cuda:0", worker_start_s=3.0, ready_s=5.5,
        ...            start_s=6.0, wall_s=16.0, gpu_s=11.0, describe_s=2.0, wait_s=1.0,
        ...            first_s=0.5)]).worker_line()
        'workers (s from the start): cuda:0 started 3.0, device ready 5.5, first key 6.0, busy 16.0 (GPU 11.0, describing 2.0, waiting 1.0, first candidate after 0.5)'
        """
        parts = []
        for w in self.workers:
            def at(name: str) -> str:
                v = w.get(name)
                return "?" if v is None else f"{v:.1f}"

            parts.append(f"{w.get('device') or '?'} started {at('worker_start_s')}, device "
                         f"ready {at('ready_s')}, first key {at('start_s')}, busy "
                         f"{w.get('wall_s', 0.0):.1f} (GPU {w.get('gpu_s', 0.0):.1f}, "
                         f"describing {w.get('describe_s', 0.0):.1f}, waiting "
                         f"{w.get('wait_s', 0.0):.1f}, first candidate after {at('first_s')})")
        return "workers (s from the start): " + "; ".join(parts)

    def startup_line(self) -> str:
        """The start-up before the first key, and what the sweep spent between candidates
        on the database.

        >>> Throughput(start_s=3.6, first_s=0.8, store_s=0.4).startup_line()
        'start-up 3.6 s before the first key; first candidate 0.8 s after it; database reads and commits 0.4 s'
        """
        start = "?" if self.start_s is None else f"{self.start_s:.1f}"
        first = "" if self.first_s is None else f"; first candidate {self.first_s:.1f} s after it"
        return (f"start-up {start} s before the first key{first}; database reads and "
                f"commits {self.store_s:.1f} s")

    @property
    def per_second(self) -> float:
        return self.candidates / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def compile_s(self) -> float:
        """Compile wall seconds: the pool's (first submit to last outcome) plus what the
        timing processes compiled at launch."""
        return (self.pool or {}).get("wall_s", 0.0) + self.jit_compile_s

    def line(self) -> str:
        """One line: compile seconds, GPU seconds, candidates per second (then how many
        were timed by their pilot only).

        >>> Throughput(wall_s=20.0, gpu_s=8.0, candidates=84, jit_compiled=3,
        ...            jit_compile_s=1.5).line()[:46]
        'compile 1.5 s (3 kernels compiled at launch); '
        """
        p = self.pool
        if p:
            fails = f", {p['failed']} failed" if p.get("failed") else ""
            hits = f", {p['cache_hits']} already cached" if p.get("cache_hits") else ""
            comp = (f"compile {self.compile_s:.1f} s ({p['submitted']} kernels in "
                    f"{p['workers']} processes, {p['cpu_s']:.0f} s of compiler time{hits}"
                    f"{fails}; {self.jit_compiled} compiled at launch)")
        else:
            comp = (f"compile {self.jit_compile_s:.1f} s ({self.jit_compiled} kernels "
                    "compiled at launch)")
        pilots = (f"; {self.pilot_only} timed by their pilot only" if self.pilot_only
                  else "")
        return (f"{comp}; GPU {self.gpu_s:.1f} s; {self.candidates} candidates in "
                f"{self.wall_s:.1f} s ({self.per_second:.2f}/s){pilots}")
