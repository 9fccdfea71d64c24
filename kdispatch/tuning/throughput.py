"""Where a tuning run's time went: compiling, the GPU, and candidates per second.

Each timing process fills a :class:`Throughput` (its GPU seconds, the kernels its own JIT
compiled, how long it described and waited for the compile pool); a run with several
workers merges them and adds the pool's own figures (:meth:`Throughput.merge`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any


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
        return out

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
