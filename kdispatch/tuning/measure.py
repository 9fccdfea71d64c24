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

A key's first timed candidate (usually the heuristic) is warmed up before its samples:
batches of graph replays until the GPU is steady, at most :data:`KEY_WARMUP_MS`
(:func:`~kdispatch.tuning.warmup.warm_until_steady`); the key's later candidates follow timed
work on the same inputs and get none. The GPU can still be ramping up (clocks, power state)
after the host-side work between keys (inputs, reference): on the H200 the heuristic at llama
bf16 b4 x 262k (~1 ms a call) was measured 15% slower than identical twins timed after it
without a warm-up (1,095 and 1,097 us against 953-956, two tunes), and in session 13 ~14%
slower than its pdl twin with a fixed 5 ms of replays as with none (none: 1,112 against 974
us); a fixed 200 ms removed it (heuristic/twin ~1.00 there; session 13 call 7,
bench/results/nvidia-h200/session13/call7-w0.txt and -w200.txt) but would cost ~33 s over a
full tune's 166 keys.
Warming until steady costs two batches a key on a warm GPU: ~10 ms (6 samples when a sample
lasts over ~1.7 ms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
#: the cap, in ms, of the warm-up before the samples of a key's first timed candidate (batches
#: of ~5 ms of replays until one is no faster than the one before; see the module). A warm
#: GPU stops after two batches (~10 ms a key: ~0.3 s over the 28 keys of the llama3-8b
#: preset); one that ramps up goes on, here up to 200 ms, the fixed warm-up that removed the
#: bias at llama b4 x 262k (a fixed 5 ms did not). 0: no warm-up.
KEY_WARMUP_MS = 200.0


@dataclass
class KeyBest:
    """The fastest full measurement of a servable candidate of one key, in this run, and
    whether any candidate of the key has been timed yet (``warm``: no warm-up is due)."""

    us: float | None = None
    warm: bool = False

    def warm_ms(self) -> float:
        """The cap of the warm-up before the next candidate's samples: :data:`KEY_WARMUP_MS`
        until a candidate of this key has been timed, then 0 (none)."""
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
        # graph replays until the GPU is steady (at most warm_ms) when it is its key's first
        # timed candidate
        return time_call(fns, tdev, warmup=1, reps=reps, stop_above_us=stop_above_us,
                         warm_ms=warm_ms)
    except infeasible_errors() as exc:
        return Verdict("infeasible", None, f"while timing: {describe(exc)}")


def pilot_note(timing: Timing, best_us: float) -> str:
    return (f"{PILOT_NOTE}: median of {timing.reps} samples of {timing.calls_per_sample} "
            f"call(s), {timing.median_us / best_us:.2f}x the key's best full measurement "
            f"({best_us:.4g} us; stops above {PILOT_RATIO}x)")


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
