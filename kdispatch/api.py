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
from kdispatch.memo import HOT as _HOT
from kdispatch.memo import _never
from kdispatch.opdef import OpConfig


def resolve(op: str, /, **args: Any) -> OpConfig:
    """The launch config for ``op`` at these shapes (``config=``: an explicit config,
    validated and returned).

    ``op`` is any registered op's name (``kdispatch.op_names()``); for the built-in ops
    see the README.
    """
    # the serving hot path first: the last entry's guard (an op's serving call: its exact
    # argument names, so never a call with config=) accepts the call's signature again
    try:
        memo = _HOT[op]  # the global dispatcher's memo of ``op``, once it resolved ``op``
        entry = memo.last
        if entry.guard(args):  # see Memo
            entry.calls += 1
            return entry.config
    except (KeyError, TypeError):  # op not resolved yet (or a guard refused by raising)
        memo = _HOT.get(op)
    # config= is popped, not a parameter: a keyword parameter costs every call ~40 ns of
    # matching its five keyword names against it (CPython 3.11/3.12)
    config = args.pop("config", None)
    if config is None and memo is not None:  # the memo hit by memo key
        try:
            mk = memo.memo_key(args)
            entry = memo.last
            if mk != entry.memo_key:
                entry = memo.entries[mk]
                memo.last = entry
            elif entry.guard is not _never:  # the key matched but not the guard: renew
                entry.guard = memo.memo_guard(args) or entry.guard  # it (where one can be)
            entry.calls += 1
            return entry.config
        except (KeyError, TypeError):  # a miss, or an unhashable argument (the slow path
            pass                       # names it)
    return _dispatch.dispatcher().resolve(op, args, config)


def explain(op: str, /, config: Any = None, **args: Any) -> Explanation:
    """Like :func:`resolve`, but returns the key, the config, the provenance
    (``memo``, ``database``, ``table``, ``heuristic`` or ``override``) and every source
    consulted."""
    return _dispatch.dispatcher().explain(op, args, config)


def stats() -> Stats:
    """Resolution counters of this process: by source, memo hits, and heuristic misses."""
    return _dispatch.dispatcher().stats()
