"""The public resolve/explain/stats calls (generic over ops).

Two call forms: the tensor form (``q=..., k_cache=..., ...``; only shapes, dtypes and
devices are read) and the plain form (``device="nvidia-h200", batch=8, ...``; the op's
plain-form arguments, each validated, unknown ones refused) for resolving a config on a
machine without that GPU. ``config=`` (a config model or a mapping) is validated and
returned as an override.
"""

from __future__ import annotations

from typing import Any

from kdispatch import dispatcher as _dispatch
from kdispatch.dispatcher import Explanation, Stats
from kdispatch.opdef import OpConfig


def resolve(op: str, /, config: Any = None, **args: Any) -> OpConfig:
    """The launch config for ``op`` at these shapes.

    ``op`` is any registered op's name (``kdispatch.op_names()``); for the built-in ops
    see the README.
    """
    d = _dispatch._DISPATCHER
    if d is not None and config is None:  # the memo hit, inlined (the serving hot path)
        hot = d._hot.get(op)  # (the op's memo, its memo_key), once the op was resolved
        if hot is not None:
            try:
                entry = hot[0].get(hot[1](args))
            except TypeError:  # an unhashable argument: the slow path names it
                entry = None
            if entry is not None:
                entry.calls += 1
                return entry.config
    return (d or _dispatch.dispatcher()).resolve(op, args, config)


def explain(op: str, /, config: Any = None, **args: Any) -> Explanation:
    """Like :func:`resolve`, but returns the key, the config, the provenance
    (``memo``, ``database``, ``table``, ``heuristic`` or ``override``) and every source
    consulted."""
    return _dispatch.dispatcher().explain(op, args, config)


def stats() -> Stats:
    """Resolution counters of this process: by source, memo hits, and heuristic misses."""
    return _dispatch.dispatcher().stats()
