"""Warming a GPU up until it is steady, before timed samples (:mod:`kdispatch.tuning.timing`'s
``warm_ms``).

A GPU that has been idle, or busy with host-side work, can run the next kernels slower for a
while (clocks and power state ramp up): the tuner saw the first candidate timed at a key
(llama b4 x 262k on the H200, ~1 ms a call) ~14% slower than identical twins timed after it,
with no warm-up and with a fixed 5 ms one; a fixed 200 ms removed it. A fixed warm-up long
enough for that ramp costs it at every key, so the warm-up here adapts: timed batches (CUDA
graph replays or eager calls) until the latest is no faster than the one before, at most a
cap. The batches' times are only read to decide when to stop; they are not samples.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable

log = logging.getLogger(__name__)

#: batches of replays (or eager calls) lasting about WARM_BATCH_MS ms, at least WARM_MIN_REPS
#: each, go on until the latest batch's median is not more than WARM_STEADY (a fraction)
#: below the previous batch's. The threshold is small because its errors cost unequally: a
#: warm batch taken for "still improving" costs one more batch (5 ms), a ramp taken for
#: "steady" leaves the first candidate timed slow. Replays of one config vary by ~0.4%
#: p20-p80 on a warm H200, the median of a 5 ms batch by less: a warm GPU stops after two.
WARM_BATCH_MS = 5.0
WARM_MIN_REPS = 3
WARM_STEADY = 0.005
#: at most this many samples in one batch (as timing's MAX_REPS)
WARM_MAX_REPS = 500


def warm_batch(sample_us: float) -> int:
    """Samples of ``sample_us`` each in one warm-up batch: about :data:`WARM_BATCH_MS`, at
    least :data:`WARM_MIN_REPS`, at most :data:`WARM_MAX_REPS`.

    >>> warm_batch(950.0), warm_batch(200.0), warm_batch(20000.0)
    (6, 25, 3)
    """
    k = math.ceil(WARM_BATCH_MS * 1e3 / max(sample_us, 1e-3))
    return int(min(WARM_MAX_REPS, max(WARM_MIN_REPS, k)))


def warm_until_steady(take: Callable[[int], list[float]], sample_us: float,
                      cap_ms: float) -> list[float]:
    """Warm the GPU up with batches of :func:`warm_batch` samples from ``take(k)`` (``k``
    more samples, their times in microseconds) until it is steady or ``cap_ms`` is spent;
    returns each batch's median sample in microseconds (empty when ``cap_ms`` <= 0).

    Steady: a batch after the first whose median is not more than :data:`WARM_STEADY`
    below the previous batch's (a warm GPU: two batches). The cap is checked after each
    batch against the batches' summed times (it may be passed by one batch); as a safety
    bound, at most ``2 * ceil(cap_ms / WARM_BATCH_MS)`` batches are taken whatever their
    times. A GPU slow at one steady speed for a while and then suddenly fast is taken for steady:
    the rule sees a gradual ramp, not a step.

    >>> warm_until_steady(lambda k: [100.0] * k, 100.0, 200.0)
    [100.0, 100.0]
    >>> speeds = iter([130.0, 120.0, 110.0, 100.0, 100.0, 100.0])
    >>> warm_until_steady(lambda k: [next(speeds)] * k, 100.0, 200.0)
    [130.0, 120.0, 110.0, 100.0, 100.0]
    >>> faster = iter(0.5 ** i for i in range(100))  # ever faster, but its times spend no cap
    >>> len(warm_until_steady(lambda k: [next(faster)] * k, 100.0, 200.0))
    80
    >>> warm_until_steady(lambda k: [100.0] * k, 100.0, 0.0)
    []
    """
    if cap_ms <= 0:
        return []
    k = warm_batch(sample_us)
    max_batches = 2 * math.ceil(cap_ms / WARM_BATCH_MS)
    medians: list[float] = []
    spent_ms = 0.0
    while True:
        batch = take(k)
        medians.append(statistics.median(batch))
        spent_ms += sum(batch) / 1e3
        if len(medians) >= 2 and medians[-1] >= medians[-2] * (1.0 - WARM_STEADY):
            break
        if spent_ms >= cap_ms or len(medians) >= max_batches:
            break
    log.debug("warm-up: %d batches of %d samples, %.1f ms, medians %s us", len(medians), k,
              spent_ms, [round(m, 1) for m in medians])
    return medians
