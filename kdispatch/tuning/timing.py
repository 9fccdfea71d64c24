"""Timing one launch: medians and quantiles of CUDA-graph replays (GPU) or wall clock (CPU).

On a GPU (per BENCHMARKING.md): warm up (compilation, allocator), capture one or more calls of
the function in a :class:`torch.cuda.CUDAGraph` (several calls per graph when one call is
short, so launch overhead does not dominate), replay the graph many times timed with CUDA
events, and report the median and the 20th/80th percentiles per call. If graph capture fails
for a reason that is not a programming error (the same function runs fine outside capture),
plain CUDA-event timing of eager calls is used instead.

On the CPU (the Triton interpreter) the times mean little; a few ``perf_counter`` reps keep
the pipeline honest and cheap.
"""

from __future__ import annotations

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
#: replays are repeated until about this much GPU time has been spent
TARGET_TOTAL_MS = 150.0
MIN_REPS, MAX_REPS = 20, 500


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
    """

    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    calls_per_sample: int = 1
    method: Method = "cuda-graph"


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


def _stats(samples_us: Sequence[float], calls: int, method: Method) -> Timing:
    per_call = [t / calls for t in samples_us]
    return Timing(median_us=quantile(per_call, 0.5), p20_us=quantile(per_call, 0.2),
                  p80_us=quantile(per_call, 0.8), reps=len(per_call), calls_per_sample=calls,
                  method=method)


def _as_list(fn: Callable[[], Any] | Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
    fns = [fn] if callable(fn) else list(fn)
    if not fns:
        raise ValueError("fn: need at least one callable")
    return fns


def time_call(fn: Callable[[], Any] | Sequence[Callable[[], Any]], device: Any, *,
              warmup: int = 3, reps: int | None = None, use_graph: bool = True) -> Timing:
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
        Untimed calls per callable first (compilation, autotuning, allocator).
    reps : int, optional
        Timed samples. Default: GPU, enough replays for ~150 ms (20..500); CPU, 3.
    use_graph : bool
        GPU only: time CUDA-graph replays (default) or eager calls.

    Returns
    -------
    Timing
        Per-call median and 20th/80th percentiles in microseconds.

    Examples
    --------
    >>> t = time_call(lambda: sum(range(100)), "cpu", warmup=1, reps=3)
    >>> t.reps, t.method
    (3, 'cpu-wall')
    """
    import torch

    fns = _as_list(fn)
    dev = torch.device(device)
    if dev.type == "cpu":
        return _time_cpu(fns, warmup=min(max(warmup, 0), 1), reps=reps or 3)
    if dev.type != "cuda":
        raise ValueError(f"device: cannot time on {dev}")
    with torch.cuda.device(dev):
        for _ in range(max(warmup, 1)):
            for f in fns:
                f()
        torch.cuda.synchronize()
        per_call_us = _estimate_us(fns)
        if use_graph:
            try:
                return _time_graph(fns, per_call_us, reps)
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
        return _time_events(fns, per_call_us, reps)


def _time_cpu(fns: list[Callable[[], Any]], *, warmup: int, reps: int) -> Timing:
    for _ in range(warmup):
        for f in fns:
            f()
    samples = []
    for i in range(reps):
        f = fns[i % len(fns)]
        t0 = time.perf_counter()
        f()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _stats(samples, 1, "cpu-wall")


def _estimate_us(fns: list[Callable[[], Any]]) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = max(5, len(fns))
    start.record()
    for i in range(n):
        fns[i % len(fns)]()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) * 1e3 / n, 0.5)


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


def _replay_us(graph: Any) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _calls_for(per_call_us: float, n_fns: int) -> int:
    calls = int(min(MAX_CALLS_PER_GRAPH, max(1, math.ceil(GRAPH_TARGET_US / per_call_us))))
    return max(calls, n_fns)  # every input set appears in the graph


def _time_graph(fns: list[Callable[[], Any]], per_call_us: float, reps: int | None) -> Timing:
    """Replays of a graph of ``calls`` calls lasting about GRAPH_TARGET_US.

    ``per_call_us`` comes from eager calls, which include the host's launch cost; for a
    launch-bound op that is many times the GPU time, so the graph is sized again from one
    timed replay (otherwise a replay's own launch latency is spread over too few calls).
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # one more eager round on the capture stream
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    calls = _calls_for(per_call_us, len(fns))
    graph = _capture(fns, calls)
    for _ in range(4):  # a replay's own latency shrinks per call as the graph grows
        gpu_us = _replay_us(graph) / calls
        if calls >= MAX_CALLS_PER_GRAPH or _calls_for(gpu_us, len(fns)) <= calls:
            break
        del graph
        calls = _calls_for(gpu_us, len(fns))
        graph = _capture(fns, calls)
        per_call_us = gpu_us
    n = _reps_for(per_call_us * calls, reps)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in events]
    del graph
    return _stats(samples, calls, "cuda-graph")


def _time_events(fns: list[Callable[[], Any]], per_call_us: float, reps: int | None) -> Timing:
    import torch

    n = _reps_for(per_call_us, reps)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for i, (s, e) in enumerate(events):
        f = fns[i % len(fns)]
        s.record()
        f()
        e.record()
    torch.cuda.synchronize()
    return _stats([s.elapsed_time(e) * 1e3 for s, e in events], 1, "cuda-events")


def _recover_after_failed_capture() -> None:
    import torch

    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:  # the capture error may surface here once more
        log.debug("synchronize after a failed capture: %s", exc)
