"""Timing one launch: medians and quantiles of CUDA-graph replays (GPU) or wall clock (CPU).

On a GPU (per BENCHMARKING.md): warm up (compilation, allocator), capture one or more calls of
the function in a :class:`torch.cuda.CUDAGraph` (several calls per graph when one call is
short, so launch overhead does not dominate), replay the graph many times timed with CUDA
events, and report the median and the 20th/80th percentiles per call. If graph capture fails
for a reason that is not a programming error (the same function runs fine outside capture),
plain CUDA-event timing of eager calls is used instead.

A caller that only needs to know whether a call can beat a time it already has passes
``stop_above_us``: the first :data:`PILOT_REPS` samples (the pilot) are checked, and a call
whose pilot median is above it is returned as a pilot (``Timing.pilot``) without the rest of
the samples. Otherwise the measurement goes on; its samples include the pilot's, so a full
measurement is the same protocol with or without the check.

A caller that times the first launch after other work (the tuner, at each key's first timed
candidate) passes ``warm_ms``: the captured graph is replayed, untimed, for about that long
right before the timed samples (eager calls when capture failed), so the first samples do
not see a GPU and caches still cold from that other work.

On the CPU (the Triton interpreter) the times mean little; a few ``perf_counter`` reps keep
the pipeline honest and cheap.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

Method = Literal["cuda-graph", "cuda-events", "cpu-wall"]

#: a graph holds enough calls to last about this long (launch overhead stays negligible)
GRAPH_TARGET_US = 200.0
MAX_CALLS_PER_GRAPH = 64
#: replays are repeated until about this much GPU time has been spent (MIN_REPS..MAX_REPS).
#: 60 ms: on the H200 (session 7, 700 rows at 150 ms) the median's sampling error implied by
#: the stored p20/p80 spread is 0.018% of the median at 150 ms and 0.024% at 60 ms (p95:
#: 0.25% -> 0.38%), both under the run-to-run difference of the same 160 candidates timed in
#: two runs (median 0.24%, p95 1.4%): the budget did not decide a median's precision.
TARGET_TOTAL_MS = 60.0
MIN_REPS, MAX_REPS = 20, 500
#: samples taken before ``stop_above_us`` is checked (a pilot; see the module)
PILOT_REPS = 5
#: at most this many untimed replays (or eager calls) for ``warm_ms``
MAX_WARM = MAX_REPS
#: a sample (one replay, or one eager call) at least this long gets the whole ``warm_ms``;
#: a shorter one at most :data:`SHORT_WARM_MS` (H200, session 13: only the key of ~1 ms
#: calls measured its first candidate slow, 14%, with 0 or 5 ms of warm-up and not with
#: 200; keys of 15-40 us calls measured the same with 0 and 200 ms)
LONG_SAMPLE_US = 500.0
SHORT_WARM_MS = 5.0


@dataclass(frozen=True)
class Timing:
    """Per-call time statistics of one candidate.

    Attributes
    ----------
    median_us, p20_us, p80_us : float
        Median and 20th/80th percentiles of the per-call time, in microseconds.
    reps : int
        Number of timed samples (graph replays or eager calls).
    calls_per_sample : int
        Calls inside one sample (calls captured per graph); per-call times divide by it.
    method : {"cuda-graph", "cuda-events", "cpu-wall"}
        How the samples were taken.
    pilot : bool
        Only the pilot's samples were taken: its median was above ``stop_above_us``.
    """

    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    calls_per_sample: int = 1
    method: Method = "cuda-graph"
    pilot: bool = False


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of ``values`` (numpy's default rule).

    >>> quantile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    >>> quantile([5.0], 0.2)
    5.0
    """
    if not values:
        raise ValueError("values: need at least one sample")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: must be in [0, 1], got {q}")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(samples_us: Sequence[float], calls: int, method: Method,
           pilot: bool = False) -> Timing:
    per_call = [t / calls for t in samples_us]
    return Timing(median_us=quantile(per_call, 0.5), p20_us=quantile(per_call, 0.2),
                  p80_us=quantile(per_call, 0.8), reps=len(per_call), calls_per_sample=calls,
                  method=method, pilot=pilot)


def staged(take: Callable[[int], list[float]], n: int, calls: int,
           stop_above_us: float | None) -> tuple[list[float], bool]:
    """``n`` samples from ``take(k)`` (``k`` more samples of ``calls`` calls each), checked
    after the first :data:`PILOT_REPS`: returns ``(samples, pilot_only)``.

    >>> staged(lambda k: [10.0] * k, 20, 1, 5.0)
    ([10.0, 10.0, 10.0, 10.0, 10.0], True)
    >>> len(staged(lambda k: [10.0] * k, 20, 1, 12.0)[0])
    20
    """
    first = min(PILOT_REPS, n) if stop_above_us is not None else n
    samples = list(take(first))
    if first < n:
        if quantile(samples, 0.5) / calls > stop_above_us:  # type: ignore[operator]
            return samples, True
        samples += take(n - first)
    return samples, False


def warm_count(warm_ms: float, sample_us: float) -> int:
    """Untimed samples of ``sample_us`` each that last about ``warm_ms`` (0 without a
    warm-up; at least one with it, at most :data:`MAX_WARM`); a sample shorter than
    :data:`LONG_SAMPLE_US` warms for at most :data:`SHORT_WARM_MS`.

    >>> warm_count(0.0, 950.0), warm_count(200.0, 950.0), warm_count(200.0, 200.0)
    (0, 211, 25)
    """
    if warm_ms <= 0:
        return 0
    if sample_us < LONG_SAMPLE_US:
        warm_ms = min(warm_ms, SHORT_WARM_MS)
    return int(min(MAX_WARM, max(1, math.ceil(warm_ms * 1e3 / max(sample_us, 1e-3)))))


def _as_list(fn: Callable[[], Any] | Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
    fns = [fn] if callable(fn) else list(fn)
    if not fns:
        raise ValueError("fn: need at least one callable")
    return fns


def time_call(fn: Callable[[], Any] | Sequence[Callable[[], Any]], device: Any, *,
              warmup: int = 3, reps: int | None = None, use_graph: bool = True,
              stop_above_us: float | None = None, warm_ms: float = 0.0) -> Timing:
    """Time one call of ``fn`` on ``device``.

    Parameters
    ----------
    fn : callable or sequence of callables
        A call taking no arguments that launches the work. A sequence is cycled through
        (one callable per input set), so a working set smaller than the L2 cache is
        rotated instead of timed hot.
    device : torch.device or str
        ``"cpu"`` times wall clock (the Triton interpreter); ``"cuda[:N]"`` uses CUDA events.
    warmup : int
        Rounds of calls (one per callable) before timing (compilation, autotuning,
        allocator); on a GPU the last round, run on the capture stream, is timed to size
        the graph. A caller that has just run ``fn`` (verified it) needs one.
    reps : int, optional
        Timed samples. Default: GPU, enough replays for ~TARGET_TOTAL_MS (MIN_REPS..
        MAX_REPS); CPU, 3.
    use_graph : bool
        GPU only: time CUDA-graph replays (default) or eager calls.
    stop_above_us : float, optional
        Stop after the pilot (:data:`PILOT_REPS` samples) when its median per call is
        above this; the result is then marked ``pilot``.
    warm_ms : float
        GPU only: untimed replays of the captured graph (eager calls when capture failed)
        lasting about this long, right before the timed samples and after the graph is
        sized (:func:`warm_count`). Default 0: none. The CPU ignores it.

    Returns
    -------
    Timing
        Per-call median and 20th/80th percentiles in microseconds.

    Examples
    --------
    >>> t = time_call(lambda: sum(range(100)), "cpu", warmup=1, reps=3)
    >>> t.reps, t.method, t.pilot
    (3, 'cpu-wall', False)
    """
    import torch

    fns = _as_list(fn)
    dev = torch.device(device)
    if dev.type == "cpu":
        return _time_cpu(fns, warmup=min(max(warmup, 0), 1), reps=reps or 3,
                         stop_above_us=stop_above_us)
    if dev.type != "cuda":
        raise ValueError(f"device: cannot time on {dev}")
    with torch.cuda.device(dev):
        if use_graph:
            try:
                return _time_graph(fns, warmup, reps, stop_above_us, warm_ms)
            except torch.cuda.OutOfMemoryError:
                raise
            except RuntimeError as exc:
                # Capture-unsupported work (a host sync, a CPU tensor) raises RuntimeError
                # during capture. If the eager call still works, the failure was capture's.
                _recover_after_failed_capture()
                for f in fns:
                    f()  # a programming error raises here and propagates
                torch.cuda.synchronize()
                log.info("CUDA-graph capture failed (%s); timing eager calls instead",
                         str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        else:
            for _ in range(max(warmup, 1)):
                for f in fns:
                    f()
            torch.cuda.synchronize()
        return _time_events(fns, _estimate_us(fns), reps, stop_above_us, warm_ms)


def _time_cpu(fns: list[Callable[[], Any]], *, warmup: int, reps: int,
              stop_above_us: float | None = None) -> Timing:
    for _ in range(warmup):
        for f in fns:
            f()
    done = 0

    def take(k: int) -> list[float]:
        nonlocal done
        out = []
        for _ in range(k):
            f = fns[done % len(fns)]
            done += 1
            t0 = time.perf_counter()
            f()
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    samples, pilot = staged(take, reps, 1, stop_above_us)
    return _stats(samples, 1, "cpu-wall", pilot)


def _estimate_us(fns: list[Callable[[], Any]]) -> float:
    """GPU microseconds per call of one round of eager calls (host launch cost included
    when it exceeds the GPU time): a first guess that a graph replay then corrects."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for f in fns:
        f()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) * 1e3 / len(fns), 0.5)


def _reps_for(sample_us: float, reps: int | None) -> int:
    if reps is not None:
        return max(1, reps)
    return int(min(MAX_REPS, max(MIN_REPS, TARGET_TOTAL_MS * 1e3 / max(sample_us, 1e-3))))


def _capture(fns: list[Callable[[], Any]], calls: int) -> Any:
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _replays(graph: Any, k: int) -> list[float]:
    """``k`` back-to-back replays of ``graph``, each timed with CUDA events (one sync)."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(k)]
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in events]


def _calls_for(per_call_us: float, n_fns: int) -> int:
    calls = int(min(MAX_CALLS_PER_GRAPH, max(1, math.ceil(GRAPH_TARGET_US / per_call_us))))
    return max(calls, n_fns)  # every input set appears in the graph


def _time_graph(fns: list[Callable[[], Any]], warmup: int, reps: int | None,
                stop_above_us: float | None, warm_ms: float = 0.0) -> Timing:
    """Replays of a graph of ``calls`` calls lasting about GRAPH_TARGET_US.

    The warm-up rounds run on the capture stream, the last one timed: that per-call time
    includes the host's launch cost, which for a launch-bound op is many times the GPU
    time, so the graph is sized again from one timed replay (otherwise a replay's own
    launch latency is spread over too few calls). The ``warm_ms`` replays follow, queued
    just before the timed ones (no sync between them: the GPU goes straight on).
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 1) - 1):
            for f in fns:
                f()
        per_call_us = _estimate_us(fns)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    calls = _calls_for(per_call_us, len(fns))
    graph = _capture(fns, calls)
    gpu_us = _replays(graph, 1)[0] / calls
    for _ in range(4):  # a replay's own latency shrinks per call as the graph grows
        if calls >= MAX_CALLS_PER_GRAPH or _calls_for(gpu_us, len(fns)) <= calls:
            break
        del graph
        calls = _calls_for(gpu_us, len(fns))
        graph = _capture(fns, calls)
        gpu_us = _replays(graph, 1)[0] / calls
    for _ in range(warm_count(warm_ms, gpu_us * calls)):
        graph.replay()
    n = _reps_for(gpu_us * calls, reps)
    samples, pilot = staged(functools.partial(_replays, graph), n, calls, stop_above_us)
    del graph
    return _stats(samples, calls, "cuda-graph", pilot)


def _time_events(fns: list[Callable[[], Any]], per_call_us: float, reps: int | None,
                 stop_above_us: float | None = None, warm_ms: float = 0.0) -> Timing:
    import torch

    done = 0
    for i in range(warm_count(warm_ms, per_call_us)):
        fns[i % len(fns)]()

    def take(k: int) -> list[float]:
        nonlocal done
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(k)]
        for s, e in events:
            f = fns[done % len(fns)]
            done += 1
            s.record()
            f()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in events]

    samples, pilot = staged(take, _reps_for(per_call_us, reps), 1, stop_above_us)
    return _stats(samples, 1, "cuda-events", pilot)


def _recover_after_failed_capture() -> None:
    import torch

    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:  # the capture error may surface here once more
        log.debug("synchronize after a failed capture: %s", exc)
