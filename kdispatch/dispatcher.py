"""Resolve a launch config on the host from shapes alone.

Lookup chain for one key::

    process memo -> user database snapshot (read once per process and device)
                 -> shipped tables (<device-key>.json) -> analytical heuristic

then an override (``config=`` argument or ``KDISPATCH_OVERRIDE``) wins over all of them and
says so. Nothing here reads device memory or synchronizes: keys come from ``.shape``,
``.dtype`` and ``.device`` only, so a resolve inside CUDA-graph capture is safe and
returns the same constant at capture and at every replay.

A missing or corrupt database or table degrades to the next source with one warning; it
never raises into a serving process. ``KDISPATCH_STRICT=1`` turns a heuristic fallback
into :class:`~kdispatch.errors.StrictMissError`. Nothing here names an op.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from kdispatch.device import Device
from kdispatch.errors import StrictMissError, short_error, warn_once
from kdispatch.memo import BEFORE_STATS, HOT, ON_RESET, Entry, Memo, _never
from kdispatch.misses import MissWriter
from kdispatch.opdef import Op, OpConfig, OpKey
from kdispatch.registry import get_op, op_names
from kdispatch.settings import OVERRIDE_ENV, Settings
from kdispatch.store import canonical_json, digest, read_best_snapshot, sqlite_path
from kdispatch.table_cache import ShippedTables

log = logging.getLogger(__name__)

Source = Literal["memo", "database", "table", "heuristic", "override"]


@dataclass(frozen=True)
class Consulted:
    """One source the resolver looked at and what it found there."""

    source: str
    outcome: str


@dataclass(frozen=True)
class Explanation:
    """What :func:`explain` returns: the key, the config, and where it came from."""

    op: str
    key: OpKey
    config: OpConfig
    provenance: Source
    origin: Source  # the source behind a memo hit (== provenance otherwise)
    consulted: tuple[Consulted, ...]


@dataclass
class Stats:
    """Counters of one process's resolutions (``kdispatch.stats()``)."""

    resolutions: int = 0
    memo_hits: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)  # "op key-json" -> calls
    db_error: str | None = None
    tables: dict[str, str] = field(default_factory=dict)  # device key -> table status


class Dispatcher:
    """Holds the memo, the database snapshots and the loaded tables of one process."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings.from_env()
        self._ops: dict[str, Op] = {}
        self._memos: dict[str, Memo] = {}  # op -> its memo (memo key -> entry)
        self._devices: dict[Any, Device] = {}
        self._db: dict[str, dict[tuple[str, str], tuple[dict, str]] | None] = {}
        self._tables = ShippedTables()
        self._lock = threading.RLock()
        self.db_error: str | None = None
        self._miss_writer: MissWriter | None = None
        if self.settings.override_error:
            warn_once("override-env", self.settings.override_error)
        unknown = sorted(set(self.settings.overrides) - set(op_names()))
        if unknown:
            warn_once("override-unknown", f"kdispatch: {OVERRIDE_ENV} names unknown ops "
                      f"{', '.join(unknown)} (known: {', '.join(op_names())}); ignored")

    # -- the hot path -------------------------------------------------------------------------
    def resolve(self, op: str, args: Mapping[str, Any], config: Any = None) -> OpConfig:
        return self.resolve_entry(op, args, config)[0]

    def resolve_entry(self, op: str, args: Mapping[str, Any], config: Any = None
                      ) -> tuple[OpConfig, Entry | None]:
        """:meth:`resolve`, also returning the memo entry (None for an explicit config), so
        a cached launch path can count its later uses in :meth:`stats`."""
        if config is not None:
            return self.explain(op, args, config).config, None
        spec = self._ops.get(op) or self._op(op)
        memo, mk, entry = self._memo_hit(op, spec, args)
        if entry is not None:
            return entry.config, entry
        entry = self._resolve_slow(spec, args, mk, memo)
        return entry.config, entry if mk is not None else None

    def _memo_hit(self, op: str, spec: Op, args: Mapping[str, Any]
                  ) -> tuple[dict[Any, Entry], Any, Entry | None]:
        """``(the op's memo, the call's memo key, the entry it hits or None)``; a hit is
        counted. The key is None where an argument is unhashable (the slow path names it)."""
        memo = self._memos[op].entries
        mk = spec.memo_key(args)
        try:
            entry = memo.get(mk)
        except TypeError:
            return memo, None, None
        if entry is not None:
            entry.calls += 1
        return memo, mk, entry

    def _op(self, name: str) -> Op:
        spec = get_op(name)
        with self._lock:
            memo = self._memos.get(name)
            if memo is None:
                memo = self._memos[name] = Memo(spec.memo_key, spec.memo_guard)
            self._ops[name] = spec
        with _INIT_LOCK:  # reset() swaps the global and clears HOT under this lock
            if self is _DISPATCHER:
                HOT[name] = memo
        return spec

    def explain(self, op: str, args: Mapping[str, Any], config: Any = None) -> Explanation:
        spec = self._ops.get(op) or self._op(op)
        if config is not None:
            key = self._key(spec, args)
            cfg = self._coerce_config(spec, key, config, "config")
            return Explanation(op, key, cfg, "override", "override",
                               (Consulted("override", "config= argument"),))
        memo, mk, entry = self._memo_hit(op, spec, args)
        if entry is not None:
            return Explanation(op, entry.key, entry.config, "memo", entry.source,
                               (Consulted("memo", f"hit ({entry.source})"), *entry.consulted))
        entry = self._resolve_slow(spec, args, mk, memo)
        return Explanation(op, entry.key, entry.config, entry.source, entry.source,
                           (Consulted("memo", "miss"), *entry.consulted))

    # -- the chain ----------------------------------------------------------------------------
    def _key(self, spec: Op, args: Mapping[str, Any]) -> OpKey:
        if spec.is_plain(args):
            return spec.key(self.device(args.get("device")), spec.plain_args(args))
        spec.check_tensor_names(args)
        return spec.key(self.device(spec.device_of(args)), args)

    def _resolve_slow(self, spec: Op, args: Mapping[str, Any], mk: Any,
                      memo: dict[Any, Entry]) -> Entry:
        key = self._key(spec, args)
        with self._lock:
            entry = memo.get(mk) if mk is not None else None
            if entry is not None:
                return entry
            entry = self._chain(spec, key)
            if mk is not None:
                entry.memo_key = mk
                if spec.memo_guard is not None:
                    entry.guard = spec.memo_guard(args) or _never
                memo[mk] = entry
        return entry

    def _chain(self, spec: Op, key: OpKey) -> Entry:
        consulted: list[Consulted] = []
        kd = digest(key.model_dump(mode="json"))
        config: OpConfig | None = None
        source: Source = "heuristic"

        rows = self._db_rows(key.device)
        if rows is None:
            consulted.append(Consulted("database", self.db_error or "not available"))
        else:
            hit = rows.get((spec.name, kd))
            if hit is None:
                consulted.append(Consulted("database", "no row for this key"))
            elif hit[1] != spec.source_hash():
                consulted.append(Consulted("database", "row is stale (kernel source changed)"))
                warn_once(f"db-stale:{spec.name}:{key.device}",
                          f"kdispatch: database rows for {spec.name} on {key.device} were "
                          "tuned with other kernel sources; using the next source")
            else:
                config = self._validated(spec, key, hit[0], "database")
                consulted.append(Consulted("database", "hit" if config is not None
                                           else "row rejected (invalid config)"))
                source = "database" if config is not None else source

        if config is None:
            config, outcome = self._tables.hit(spec, key.device, kd)
            consulted.append(Consulted("table", outcome))
            source = "table" if config is not None else source

        override = self.settings.overrides.get(spec.name)
        if config is None:
            config = spec.heuristic(key)
            consulted.append(Consulted("heuristic", "computed"))
            if self.settings.strict and override is None:
                raise StrictMissError(
                    f"KDISPATCH_STRICT: no tuned config for {spec.name} key "
                    f"{key.model_dump(mode='json')}; tune it (kdispatch tune) or unset strict")
            self._record_miss(spec, key)

        if override is not None:
            merged = {**config.model_dump(), **override}
            cfg = self._coerce_config(spec, key, merged, OVERRIDE_ENV, warn=True)
            if cfg is not None:
                config, source = cfg, "override"
                consulted.append(Consulted("override", f"{OVERRIDE_ENV} {override}"))
        return Entry(op=spec.name, key=key, config=config, source=source,
                     consulted=tuple(consulted))

    def _validated(self, spec: Op, key: OpKey, data: Mapping[str, Any],
                   where: str) -> OpConfig | None:
        try:
            config = spec.parse_config(data)
            spec.check_config(key, config, served=True)
            return config
        except (ValueError, ValidationError) as exc:
            warn_once(f"invalid:{where}:{spec.name}:{key.device}",
                      f"kdispatch: rejected an invalid {spec.name} config from the {where}: "
                      f"{short_error(exc)}")
            return None

    def _coerce_config(self, spec: Op, key: OpKey, config: Any, name: str,
                       warn: bool = False) -> OpConfig | None:
        try:
            if isinstance(config, spec.config_model):
                cfg = config
            elif isinstance(config, Mapping):
                cfg = spec.parse_config(config)
            else:
                raise ValueError(f"expected {spec.config_model.__name__} or a mapping, got "
                                 f"{type(config).__name__}")
            spec.check_config(key, cfg, served=warn)
            return cfg
        except (ValueError, ValidationError) as exc:
            msg = f"{name}: invalid {spec.name} config: {short_error(exc)}"
            if warn:
                warn_once(f"override:{spec.name}", f"kdispatch: {msg}; ignored")
                return None
            raise ValueError(msg) from None

    # -- sources ------------------------------------------------------------------------------
    def device(self, named: Any) -> Device:
        if isinstance(named, Device):
            return named
        try:
            dev = self._devices.get(named)
        except TypeError:
            raise ValueError(f"device: expected a device key or a torch device, got "
                             f"{type(named).__name__}") from None
        if dev is None:
            if named is None:
                dev = Device.current()
            elif isinstance(named, str) and not _looks_like_torch_device(named):
                dev = Device.from_key(named)
            else:
                dev = Device.from_torch(named)
            self._devices[named] = dev
        return dev

    def _db_rows(self, device_key: str) -> dict[tuple[str, str], tuple[dict, str]] | None:
        if device_key in self._db:
            return self._db[device_key]
        rows: dict[tuple[str, str], tuple[dict, str]] | None = None
        url = self.settings.db_url
        path = sqlite_path(url)
        if path is not None and not path.exists():
            self.db_error = f"no database file at {path}"
            if self.settings.db_explicit:
                warn_once("db-missing", f"kdispatch: KDISPATCH_DB names {path}, which does not "
                          "exist; using shipped tables and heuristics")
            else:
                log.debug(self.db_error)
        else:
            try:
                rows = {(r.op, r.key_digest): (r.config, r.source_hash)
                        for r in read_best_snapshot(url, device_key)}
            except Exception as exc:  # noqa: BLE001 - a broken database never breaks serving
                self.db_error = f"database unusable: {short_error(exc)}"[:500]
                warn_once("db-error", f"kdispatch: {self.db_error}; using shipped tables "
                          "and heuristics")
                rows = None
        self._db[device_key] = rows
        return rows

    # -- misses -------------------------------------------------------------------------------
    def _record_miss(self, spec: Op, key: OpKey) -> None:
        if not self.settings.record_misses:
            return
        if self._miss_writer is None:
            self._miss_writer = MissWriter(self.settings.db_url)
        self._miss_writer.put(spec.name, key.model_dump(mode="json"))

    def flush_misses(self, timeout: float = 30.0) -> None:
        if self._miss_writer is not None:
            self._miss_writer.flush(timeout)

    def stats(self) -> Stats:
        for hook in list(BEFORE_STATS):
            hook()
        s = Stats(db_error=self.db_error, tables=self._tables.summary())
        for entry in [e for memo in list(self._memos.values())
                      for e in list(memo.entries.values())]:
            s.resolutions += entry.calls
            s.memo_hits += entry.calls - 1
            s.by_source[entry.source] = s.by_source.get(entry.source, 0) + entry.calls
            if entry.source == "heuristic":
                name = f"{entry.op} {canonical_json(entry.key.model_dump(mode='json'))}"
                s.misses[name] = s.misses.get(name, 0) + entry.calls
        return s


def _looks_like_torch_device(name: str) -> bool:
    return name in ("cpu", "cuda") or name.startswith(("cuda:", "hip:"))


_DISPATCHER: Dispatcher | None = None
_INIT_LOCK = threading.Lock()


def dispatcher() -> Dispatcher:
    global _DISPATCHER
    d = _DISPATCHER
    if d is None:
        with _INIT_LOCK:
            if _DISPATCHER is None:
                _DISPATCHER = Dispatcher()
            d = _DISPATCHER
    return d


def reset(settings: Settings | None = None) -> Dispatcher:
    """Drop the memo, snapshots and tables and re-read the environment (tests, tools)."""
    global _DISPATCHER
    with _INIT_LOCK:
        old = _DISPATCHER
        if old is not None:
            old.flush_misses(5.0)
        _DISPATCHER = Dispatcher(settings)
        HOT.clear()
        for hook in list(ON_RESET):
            hook()
        return _DISPATCHER
