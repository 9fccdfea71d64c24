"""Recording heuristic misses from a serving process, off the resolve path."""

from __future__ import annotations

import atexit
import queue
import threading

from kdispatch.errors import warn_once


class MissWriter:
    """Writes recorded misses from a background thread: never on the resolve path.

    Each new key is queued once (the memo sees a key's heuristic fallback once), so a
    serving process makes at most one write per new key, and none from the thread that
    may be capturing a CUDA graph.
    """

    def __init__(self, url: str):
        self.url = url
        self.q: queue.Queue[tuple[str, dict] | threading.Event] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="kdispatch-misses", daemon=True)
        self.thread.start()
        atexit.register(self.flush, 10.0)

    def put(self, op: str, key: dict) -> None:
        self.q.put((op, key))

    def flush(self, timeout: float = 30.0) -> None:
        done = threading.Event()
        self.q.put(done)
        done.wait(timeout)

    def _run(self) -> None:
        from kdispatch.store import Store

        store = None
        while True:
            item = self.q.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                store = store or Store(self.url)
                store.record_miss(*item)
            except Exception as exc:  # noqa: BLE001 - recording is best effort
                warn_once("miss-writer", f"kdispatch: could not record a miss: {exc}")
