"""The op registry: built-in ops, ops registered in code, and ops of other packages.

Three ways in, looked up in this order:

- :func:`register` (code: a user's op, a test's fake);
- the built-in op packages named in ``kdispatch.kernels.BUILTIN_OPS`` (imported on first
  use, so ``import kdispatch`` stays cheap and the Triton interpreter can still be chosen);
- the ``kdispatch.ops`` entry point group of installed packages: one entry per op, named
  as the op, whose value names the :class:`~kdispatch.opdef.Op` object (loaded on first
  use, so listing the ops imports no plugin).

Nothing here names an op.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from kdispatch.errors import warn_once
from kdispatch.opdef import Op

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kdispatch.ops"
BUILTIN_PACKAGE = "kdispatch.kernels"

_LOADED: dict[str, Op] = {}
_REGISTERED: set[str] = set()
_ENTRY_POINTS: dict[str, Any] | None = None  # op name -> entry point (not loaded yet)
_lock = threading.RLock()


def _builtin_modules() -> dict[str, str]:
    """op name -> module of the built-in op packages (a cheap import: names only)."""
    return dict(importlib.import_module(BUILTIN_PACKAGE).BUILTIN_OPS)


def _entry_points() -> dict[str, Any]:
    global _ENTRY_POINTS
    if _ENTRY_POINTS is None:
        from importlib.metadata import entry_points

        found: dict[str, Any] = {}
        try:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                found.setdefault(ep.name, ep)
        except Exception as exc:  # noqa: BLE001 - broken metadata never breaks serving
            warn_once("entry-points", f"kdispatch: could not read {ENTRY_POINT_GROUP} entry "
                      f"points: {exc}")
        _ENTRY_POINTS = found
    return _ENTRY_POINTS


def _check(op: Any) -> Op:
    if not isinstance(op, Op):
        raise TypeError(f"op: expected a kdispatch.Op instance, got {type(op).__name__}")
    name = getattr(op, "name", None)
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ValueError(f"op: name must be a non-empty string of at most 64 characters, "
                         f"got {name!r}")
    return op


def register(op: Op, *, replace: bool = False) -> Op:
    """Make ``op`` resolvable, launchable and tunable by name in this process.

    Raises
    ------
    ValueError
        The name is taken by another op (pass ``replace=True`` to replace it).
    """
    _check(op)
    with _lock:
        have = _LOADED.get(op.name)
        taken = have is not None and have is not op
        if not replace and (taken or (have is None and op.name in _builtin_modules())):
            raise ValueError(f"op: {op.name!r} is already registered")
        _LOADED[op.name] = op
        _REGISTERED.add(op.name)
    return op


def unregister(name: str) -> None:
    """Forget an op registered with :func:`register` (no error if absent)."""
    with _lock:
        if name in _REGISTERED:
            _REGISTERED.discard(name)
            _LOADED.pop(name, None)


def _load_entry_point(name: str, ep: Any) -> Op | None:
    try:
        obj = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin never breaks serving
        warn_once(f"ep:{name}", f"kdispatch: entry point {ep.value!r} ({ENTRY_POINT_GROUP}) "
                  f"failed to load: {type(exc).__name__}: {exc}")
        return None
    for op in obj if isinstance(obj, list | tuple) else [obj]:
        try:
            _check(op)
        except (TypeError, ValueError) as exc:
            warn_once(f"ep:{name}", f"kdispatch: entry point {ep.value!r}: {exc}")
            continue
        _LOADED.setdefault(op.name, op)
    return _LOADED.get(name)


def get_op(name: str) -> Op:
    """The op registered as ``name``; ValueError naming the known ops otherwise."""
    op = _LOADED.get(name)
    if op is not None:
        return op
    with _lock:
        op = _LOADED.get(name)
        if op is not None:
            return op
        module = _builtin_modules().get(name)
        if module is not None:
            op = _check(importlib.import_module(module).OP)
            _LOADED[name] = op
            return op
        ep = _entry_points().get(name)
        if ep is not None:
            op = _load_entry_point(name, ep)
            if op is not None:
                return op
    raise ValueError(f"op: unknown op {name!r}; known: {', '.join(op_names())}")


def op_names() -> list[str]:
    """Every op name: built-in, registered and declared by installed packages."""
    return sorted(set(_builtin_modules()) | set(_LOADED) | set(_entry_points()))


def all_ops() -> list[Op]:
    """Every op that loads (a broken plugin is skipped with a warning)."""
    out = []
    for name in op_names():
        try:
            out.append(get_op(name))
        except ValueError:
            continue
    return out
