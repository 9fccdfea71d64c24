"""Just enough of ``torch.cuda`` for :func:`~kdispatch.tuning.timing.time_call`'s graph path
on the CPU: a clock that a kernel call advances (a captured call is only recorded, a replay
runs its calls), events that read the clock, and a log of what reached the "GPU"."""

from __future__ import annotations

import contextlib
from collections.abc import Callable


class FakeCuda:
    """Installed on ``torch.cuda`` through ``monkeypatch`` for one test.

    ``log`` holds, in order, ``"call"`` for each kernel call that ran, ``"replay"`` for each
    graph replay (before its calls) and ``"record"`` for each event recorded: a timed replay
    is ``record, replay, call..., record``; an untimed one has no ``record`` around it.
    """

    def __init__(self, monkeypatch):
        import torch

        self.now_ms, self.capturing, self.replays, self.calls = 0.0, None, 0, 0
        self.log: list[str] = []
        fake = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                fake.log.append("record")
                self.t = fake.now_ms

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.t - self.t

        class CUDAGraph:
            def __init__(self):
                self.fns = []

            def replay(self):
                fake.replays += 1
                fake.log.append("replay")
                for f in self.fns:
                    f()

        class Stream:
            def wait_stream(self, other):
                pass

        @contextlib.contextmanager
        def graph(g):
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None

        for name, value in {"Event": Event, "CUDAGraph": CUDAGraph, "Stream": Stream,
                            "graph": graph, "current_stream": lambda: Stream(),
                            "stream": lambda s: contextlib.nullcontext(),
                            "device": lambda d: contextlib.nullcontext(),
                            "synchronize": lambda *a: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    def kernel(self, us: float | Callable[[float], float]) -> Callable[[], None]:
        """A kernel call lasting ``us`` microseconds, or ``us(now_ms)`` when it depends on
        the clock (a GPU that is slow until it has warmed up)."""
        def call():
            if self.capturing is not None:
                self.capturing.fns.append(call)
            else:
                self.calls += 1
                self.log.append("call")
                self.now_ms += (us(self.now_ms) if callable(us) else us) / 1000
        return call
