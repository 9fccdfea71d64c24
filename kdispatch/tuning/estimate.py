"""How many candidates a run measures: each key's full valid space when the time allows it.

The model presets cap their candidates per key (``Preset.max_candidates``); ``kdispatch
tune`` lifts the caps when the estimated time of the full spaces fits the budget
(``--budget-minutes``, or :data:`ALLOWANCE_MINUTES` without one), and keeps them otherwise
and on the Triton interpreter (which times nothing worth a full search). ``--max-candidates
N`` caps every key at N; ``--max-candidates all`` measures every full space.

The estimate is deliberately simple: kernels are compiled by the pool (or, without one, by
the timing processes one at a time) while the GPUs verify and time; the slower of the two
sets the pace. Its constants are per-candidate averages that ``tools/bench_tune.py``
measures on an H200 host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kdispatch.registry import get_op
from kdispatch.tuning.plan import TuneTarget, candidate_list

#: distinct kernel variants per candidate (keys of one op share most of them). H200 host,
#: session 8 (bench/results/nvidia-h200/session8/tune-full.txt): 1,775 kernels for 2,886
#: candidates (0.62), 1,585 s of compiler time (0.89 s each)
VARIANTS_PER_CANDIDATE = 0.6
#: seconds one CPU core takes to compile one variant
COMPILE_S_PER_VARIANT = 0.9
#: seconds one GPU takes to verify and time one candidate (inputs and reference made once
#: per key, pilots): session 8 measured 0.055 (every preset's full space), 0.070 (10 per
#: key) and 0.082 (llama3-8b at 6 per key)
GPU_S_PER_CANDIDATE = 0.08
#: process start, imports, driver and pool start-up
STARTUP_S = 10.0
#: without --budget-minutes, full spaces are searched when they take at most this long
ALLOWANCE_MINUTES = 30.0

SpaceMode = Literal["auto", "full", "capped"]


@dataclass(frozen=True)
class SpaceSize:
    """Candidates of a list of keys: with their caps, and in their full valid spaces."""

    keys: int
    capped: int
    full: int


def space_sizes(targets: Sequence[TuneTarget]) -> SpaceSize:
    """Count the candidates ``targets`` measure with their caps and without (heuristic and
    baseline included; nothing already measured is subtracted)."""
    capped = full = 0
    for t in targets:
        op = get_op(t.op)
        key = op.parse_key(t.key)
        n = len(candidate_list(op, key))
        full += n
        capped += n if t.max_candidates is None else min(n, len(
            candidate_list(op, key, t.max_candidates)))
    return SpaceSize(len(targets), capped, full)


def estimate_seconds(candidates: int, *, compile_workers: int, gpus: int = 1) -> float:
    """Estimated wall seconds to measure ``candidates`` on ``gpus`` with a pool of
    ``compile_workers`` processes (0: each timing process compiles its own kernels).

    >>> round(estimate_seconds(100, compile_workers=15))
    40
    >>> round(estimate_seconds(100, compile_workers=0))
    88
    """
    gpus = max(gpus, 1)
    compile_s = candidates * VARIANTS_PER_CANDIDATE * COMPILE_S_PER_VARIANT
    gpu_s = candidates * GPU_S_PER_CANDIDATE / gpus
    if compile_workers <= 0:
        return STARTUP_S + compile_s / gpus + gpu_s
    return STARTUP_S + max(compile_s / compile_workers, gpu_s)


@dataclass(frozen=True)
class SpaceRule:
    """How :func:`~kdispatch.tuning.parallel.plan_targets` sizes each key's candidates.

    ``mode`` is ``"full"`` (every valid candidate), ``"capped"`` (the presets' caps) or
    ``"auto"`` (full when :func:`estimate_seconds` fits ``budget_minutes``, or
    :data:`ALLOWANCE_MINUTES` without a budget; capped on the interpreter).
    """

    mode: SpaceMode = "auto"
    budget_minutes: float | None = None
    compile_workers: int = 0
    gpus: int = 1

    def apply(self, targets: list[TuneTarget], *, interpreter: bool
              ) -> tuple[list[TuneTarget], str | None]:
        """The targets with their caps kept or lifted, and a note saying which and why."""
        capped = [t for t in targets if t.max_candidates is not None]
        if self.mode == "capped" or not capped:
            return targets, None
        size = space_sizes(targets)
        full = [dataclasses.replace(t, max_candidates=None) for t in targets]
        if self.mode == "full":
            return full, f"full search: {size.full} candidates over {size.keys} keys"
        if interpreter:
            return targets, (f"{size.capped} of the {size.full} valid candidates (the "
                             "presets' caps: the interpreter's times mean little; "
                             "--max-candidates all for the full search)")
        est = estimate_seconds(size.full, compile_workers=self.compile_workers,
                               gpus=self.gpus)
        limit = self.budget_minutes if self.budget_minutes is not None \
            else ALLOWANCE_MINUTES
        what = "the budget" if self.budget_minutes is not None else "the allowance"
        if est <= limit * 60:
            return full, (f"full search: {size.full} candidates over {size.keys} keys "
                          f"(estimated {est / 60:.1f} min, within {what} of {limit:g} min)")
        return targets, (f"{size.capped} of the {size.full} valid candidates (the presets' "
                         f"caps: the full search would take about {est / 60:.0f} min, over "
                         f"{what} of {limit:g} min; --max-candidates all to run it)")
