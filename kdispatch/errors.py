"""Exceptions and warnings raised by kdispatch, and a once-per-process warning helper."""

from __future__ import annotations

import logging
import threading
import warnings

log = logging.getLogger("kdispatch")


class KDispatchWarning(UserWarning):
    """A degraded but working state: a missing/corrupt table or database, a stale row."""


class StrictMissError(LookupError):
    """``KDISPATCH_STRICT=1`` and a key had no tuned config (database or table)."""


class StoreError(RuntimeError):
    """The tuning database cannot be used (bad URL, unknown schema version, ...)."""


_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(tag: str, message: str) -> bool:
    """Emit ``message`` as a KDispatchWarning (and a log record) once per ``tag``."""
    with _lock:
        if tag in _warned:
            return False
        _warned.add(tag)
    log.warning(message)
    warnings.warn(message, KDispatchWarning, stacklevel=3)
    return True


def reset_warnings() -> None:
    with _lock:
        _warned.clear()


def short_error(exc: BaseException) -> str:
    """One line naming what is wrong; for pydantic errors, each field and its message."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            parts = [f"{'.'.join(str(p) for p in e.get('loc', ())) or 'value'}: {e.get('msg')}"
                     for e in errors()]
            if parts:
                return "; ".join(parts)[:500]
        except (TypeError, AttributeError):
            pass
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]
