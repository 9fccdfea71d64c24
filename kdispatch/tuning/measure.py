"""One candidate's row: verified on its key's shared inputs, then timed, in full only when it
can win.

Every candidate is verified against the key's fp32 reference before it is timed; a wrong or
infeasible one is recorded as such and never timed. A verified candidate is timed with a
pilot first (:data:`~kdispatch.tuning.timing.PILOT_REPS` graph replays) when its key already
has a full measurement of a servable candidate: if the pilot's median is above
:data:`PILOT_RATIO` times that best, the candidate cannot be the key's best, and its row
keeps the pilot's timing, marked in its ``error`` text (:data:`PILOT_NOTE`), instead of the
full protocol. The heuristic is always timed in full (the summary's speedup is against it),
and so is every candidate that may win, so a key's best is always a full measurement.

A key's first timed candidate (usually the heuristic) gets :data:`KEY_WARMUP_MS` of untimed
graph replays before its samples when they are long (at most ``timing.SHORT_WARM_MS`` when
short); the key's later candidates follow timed work on the same inputs and get none.
Without it the heuristic at llama b4 x 262k (~1 ms calls) was measured 14-15% slower than
identical twins timed after it, in four tunes (1,095-1,112 us against 952-975), with 0 ms,
with 5 ms and with 10-15 ms of replays until two 5 ms batches timed the same; with 200 ms
it measured as its twins (bench/results/nvidia-h200/session13/call7-*.txt, call8-*.txt).

The warm-up does not settle compute-bound keys: at the Gluon MLA tile's keys whichever
split count was timed first measured up to ~10% slower than when timed later (128 heads
b32 x 32,768: 2 splits first in session 18's tune, 4 splits first in session 20's, each
time the other one best; docs/decode_notes.md v14, v20). So the key's first fully timed
candidate is timed again once its key's other candidates are, and its row keeps the faster
of the two (:func:`retime_first`, called by the sweep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kdispatch.opdef import Op, OpConfig
from kdispatch.store import MeasurementIn
from kdispatch.tuning.inputs import KeyInputs
from kdispatch.tuning.plan import Role
from kdispatch.tuning.timing import Timing, time_call
from kdispatch.tuning.verify import Verdict, describe, infeasible_errors, verify

#: a pilot this much slower than the key's best full measurement ends the candidate's timing
#: (graph-replay medians of one config vary by ~0.4% p20-p80 and 0.24% run to run on the
#: H200, a pilot of 5 replays by a few %: 25% is far outside noise)
PILOT_RATIO = 1.25
#: how a row timed by its pilot only starts its ``error`` text (the store has no reps column)
PILOT_NOTE = "pilot only"
#: untimed GPU work, in ms, before the samples of a key's first timed candidate when its
#: samples are long (>= timing.LONG_SAMPLE_US: ~200 replays of a ~1 ms call); shorter ones
#: get timing.SHORT_WARM_MS (a few dozen replays of a short op's 200 us graph). Per key,
#: not per candidate
KEY_WARMUP_MS = 200.0


@dataclass
class KeyBest:
    """The fastest full measurement of a servable candidate of one key, in this run, and
    whether any candidate of the key has been timed yet (``warm``: no warm-up is due)."""

    us: float | None = None
    warm: bool = False

    def warm_ms(self) -> float:
        """Untimed warm-up before the next candidate's samples: :data:`KEY_WARMUP_MS` until
        a candidate of this key has been timed, then none."""
        return 0.0 if self.warm else KEY_WARMUP_MS

    def stop_above(self, role: Role) -> float | None:
        """The pilot threshold for a candidate of ``role`` (None: time it in full)."""
        if role == "heuristic" or self.us is None:
            return None
        return PILOT_RATIO * self.us

    def update(self, role: Role, timing: Timing | None) -> None:
        if timing is not None:
            self.warm = True
        if timing is None or timing.pilot or role == "baseline":
            return  # a baseline may never be chosen: it sets no bar for the candidates
        if self.us is None or timing.median_us < self.us:
            self.us = timing.median_us


def _timed(spec: Op, config: OpConfig, sets: list[dict[str, Any]], tdev: Any,
           reps: int | None, stop_above_us: float | None,
           warm_ms: float = 0.0) -> Timing | Verdict:
    fns = [lambda inp=inp: spec.tuning.run(config, inp) for inp in sets]
    try:
        # one warm-up round: verification has just run (compiled, loaded) the candidate;
        # warm_ms of graph replays when it is its key's first timed candidate
        return time_call(fns, tdev, warmup=1, reps=reps, stop_above_us=stop_above_us,
                         warm_ms=warm_ms)
    except infeasible_errors() as exc:
        return Verdict("infeasible", None, f"while timing: {describe(exc)}")


def pilot_note(timing: Timing, best_us: float) -> str:
    return (f"{PILOT_NOTE}: median of {timing.reps} samples of {timing.calls_per_sample} "
            f"call(s), {timing.median_us / best_us:.2f}x the key's best full measurement "
            f"({best_us:.4g} us; stops above {PILOT_RATIO}x)")


#: how a row timed twice (first and again at its key's end) starts its ``error`` text
RETIMED_NOTE = "timed twice"


def retime_first(first: MeasurementIn, again: MeasurementIn) -> MeasurementIn:
    """The row of a key's first fully timed candidate after its second timing at the key's
    end: the faster of the two, noting both medians; the first row unchanged when the
    second is not a full ok timing (it failed verification or stopped at its pilot)."""
    if (again.status != "ok" or again.median_us is None or first.median_us is None
            or (again.error or "").startswith(PILOT_NOTE)):
        return first
    keep = again if again.median_us < first.median_us else first
    return replace(keep, error=f"{RETIMED_NOTE} (at its key's start and end): the faster kept")


def measure(spec: Op, key: Any, cfg: OpConfig, role: Role, inputs: KeyInputs, tdev: Any,
            reps: int | None, source_hash: str, key_data: dict[str, Any],
            best: KeyBest) -> tuple[MeasurementIn, Timing | None]:
    """Verify then time one candidate; never raises for infeasible configs.

    Returns the row and the timing (None when it was not timed); ``best`` is updated.
    """
    work = inputs.for_candidate()
    verdict = verify(spec.tuning, key, cfg, work, inputs.reference)
    timing: Timing | None = None
    note = verdict.error
    if verdict.ok:
        stop = best.stop_above(role)
        got = _timed(spec, cfg, [work, *inputs.rotation], tdev, reps, stop, best.warm_ms())
        if isinstance(got, Verdict):
            verdict = Verdict(got.status, verdict.max_error, got.error)
            note = got.error
        else:
            timing = got
            if timing.pilot and best.us is not None:
                note = pilot_note(timing, best.us)
    del work
    best.update(role, timing)
    row = MeasurementIn(
        op=spec.name, key=key_data, config=cfg.model_dump(mode="json"),
        source_hash=source_hash, status=verdict.status, verified=verdict.ok,
        is_heuristic=role == "heuristic", is_baseline=role == "baseline",
        median_us=timing.median_us if timing else None,
        p20_us=timing.p20_us if timing else None,
        p80_us=timing.p80_us if timing else None,
        max_error=verdict.max_error if verdict.max_error is None
        or math.isfinite(verdict.max_error) else None,
        error=note)
    return row, timing
