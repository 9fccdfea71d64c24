"""The process memo's structures: one op's :class:`Memo` of :class:`Entry` objects, and
:data:`HOT`, the memos the public resolve's inlined hit reads (see :mod:`kdispatch.api`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kdispatch.dispatcher import Consulted, Source
    from kdispatch.opdef import OpConfig, OpKey

#: a guard that accepts no call: 0 for any argument (how often it is in an empty tuple); a
#: builtin method, ~15 ns a call (``().__contains__``, a slot wrapper, costs 40-50 ns)
_never: Callable[[Any], int] = ().count


@dataclass(slots=True)
class Entry:
    """One memoized resolution; ``calls`` counts its uses (cached launch paths add theirs)."""

    op: str
    key: OpKey
    config: OpConfig
    source: Source
    consulted: tuple[Consulted, ...]
    calls: int = 1
    memo_key: Any = None  # the memo key it is stored under (None: not memoized)
    guard: Callable[[Mapping[str, Any]], bool] = _never  # see Memo


class Memo:
    """One op's memo: memo key -> entry, and the entry the public resolve served last (a
    serving loop resolves one signature per layer, so the last entry's memo key usually
    matches: one tuple comparison instead of hashing the key). A hit on ``last`` is the
    dict's own criterion (the memo keys compare equal), so it never serves another key.
    The hit first tries ``last.guard`` (the op's ``memo_guard`` of the call that made the
    entry: True only for calls of its memo key; decode's serving call: one C++ check, no
    memo key read), renewed where it fails but the memo key matches (a guard also
    compares what the key does not read, e.g. ``requires_grad``, inference mode).
    The hit itself is inlined in :func:`kdispatch.resolve`."""

    __slots__ = ("entries", "memo_key", "memo_guard", "last")

    def __init__(self, memo_key: Any, memo_guard: Any = None):
        self.entries: dict[Any, Entry] = {}
        self.memo_key = memo_key  # the op's memo_key
        self.memo_guard = memo_guard  # the op's (None: none)
        self.last: Entry | _NoEntry = _NO_ENTRY


class _NoKey:
    """Equal to no memo key."""

    __slots__ = ()


class _NoEntry:
    """The initial ``Memo.last``: its memo key equals no memo key."""

    __slots__ = ()
    memo_key = _NoKey()
    config = None
    guard = staticmethod(_never)


_NO_ENTRY = _NoEntry()

#: op -> the global dispatcher's :class:`Memo` (the public resolve's memo hit reads only
#: this); filled under ``_INIT_LOCK`` by that dispatcher, cleared (never replaced) by reset
HOT: dict[str, Memo] = {}

#: callables run at the start of every ``Dispatcher.stats()`` (a native launch cache folds
#: the calls it served into their entries' ``calls``) and on every ``reset()`` (it drops
#: launches resolved by the old dispatcher)
BEFORE_STATS: list[Callable[[], None]] = []
ON_RESET: list[Callable[[], None]] = []
