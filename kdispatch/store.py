"""The tuning database: runs, measurements and recorded misses (SQLAlchemy 2.x).

SQLite by default (WAL mode, a busy timeout, and a file lock around every write so several
processes can share one file), or any SQLAlchemy URL, so a team can point every tuner and
server at one PostgreSQL database. Each measurement is committed on its own, so a killed
tuner loses at most the candidate in flight.

Keys are stored as typed columns (device fields, dtype, heads, dims, page size, buckets)
plus the full key as canonical JSON and its digest, which is what lookups match on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from sqlalchemy import (Boolean, DateTime, Float, ForeignKey, Integer, String, Text,
                        UniqueConstraint, create_engine, event, func, select)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from kdispatch.errors import StoreError
from kdispatch.settings import db_url as _db_url

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

# Typed key columns shared by the ops; a key fills those it has.
KEY_INT_COLUMNS = ("cu_count", "num_q_heads", "num_kv_heads", "head_dim", "head_dim_v",
                   "page_size", "batch", "context", "tokens")


def canonical_json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def digest(data: Mapping[str, Any]) -> str:
    """Stable digest of a key or config dict (sha256 of canonical JSON, 32 hex)."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:32]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "kd_meta"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class TuningRun(Base):
    __tablename__ = "kd_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device_key: Mapped[str] = mapped_column(String(64), index=True)
    device_name: Mapped[str] = mapped_column(String(128))
    vendor: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(32))
    cu_count: Mapped[int] = mapped_column(Integer)
    kdispatch_version: Mapped[str] = mapped_column(String(32))
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(32))
    source_hashes: Mapped[str] = mapped_column(Text)  # JSON: op -> kernel source hash
    host: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")


class Measurement(Base):
    __tablename__ = "kd_measurements"
    __table_args__ = (
        UniqueConstraint("op", "device_key", "key_digest", "config_digest", "source_hash",
                         "torch_version", "triton_version", name="uq_measurement"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("kd_runs.id"), nullable=True)
    op: Mapped[str] = mapped_column(String(64), index=True)
    device_key: Mapped[str] = mapped_column(String(64), index=True)
    vendor: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(32))
    cu_count: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str | None] = mapped_column(String(16), nullable=True)
    num_q_heads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_kv_heads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    head_dim: Mapped[int | None] = mapped_column(Integer, nullable=True)
    head_dim_v: Mapped[int | None] = mapped_column(Integer, nullable=True)
    page_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    batch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    context: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    key_json: Mapped[str] = mapped_column(Text)
    key_digest: Mapped[str] = mapped_column(String(32), index=True)
    config_json: Mapped[str] = mapped_column(Text)
    config_digest: Mapped[str] = mapped_column(String(32))
    source_hash: Mapped[str] = mapped_column(String(32))
    kdispatch_version: Mapped[str] = mapped_column(String(32))
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))  # ok | rejected | infeasible
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    is_heuristic: Mapped[bool] = mapped_column(Boolean, default=False)
    # timed for comparison only (e.g. kv_write's indexed writes): never a best config
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    median_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    p20_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    p80_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)


class Miss(Base):
    __tablename__ = "kd_misses"
    __table_args__ = (UniqueConstraint("op", "device_key", "key_digest", name="uq_miss"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    op: Mapped[str] = mapped_column(String(64))
    device_key: Mapped[str] = mapped_column(String(64), index=True)
    key_json: Mapped[str] = mapped_column(Text)
    key_digest: Mapped[str] = mapped_column(String(32))
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    tuned: Mapped[bool] = mapped_column(Boolean, default=False)


# Ordered migrations: target version -> function(connection). Version 1 is the base schema.
def _migrate_to_1(conn: Any) -> None:
    Base.metadata.create_all(conn)


MIGRATIONS: dict[int, Any] = {1: _migrate_to_1}


@dataclass(frozen=True)
class BestRow:
    """The fastest verified measurement for one key."""

    op: str
    device_key: str
    key: dict[str, Any]
    key_digest: str
    config: dict[str, Any]
    median_us: float
    source_hash: str
    torch_version: str
    triton_version: str


@dataclass(frozen=True)
class MeasurementIn:
    """What a tuner records for one candidate."""

    op: str
    key: dict[str, Any]
    config: dict[str, Any]
    source_hash: str
    status: str
    verified: bool
    is_heuristic: bool = False
    is_baseline: bool = False
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    max_error: float | None = None
    error: str | None = None


def sqlite_path(url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL, else None (memory or another backend)."""
    if not url.startswith("sqlite"):
        return None
    path = url.split(":///", 1)[1] if ":///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


class Store:
    """A handle on one tuning database. Thread-safe; cheap to keep for a process."""

    def __init__(self, url: str | None = None, *, create: bool = True,
                 toolchain: Mapping[str, str] | None = None):
        self.url = _db_url(url)
        self.path = sqlite_path(self.url)
        if self.path is not None:
            if not create and not self.path.exists():
                raise StoreError(f"database file {self.path} does not exist")
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.path) + ".lock", timeout=120) if self.path else None
        self._thread_lock = threading.RLock()
        try:
            self.engine = _make_engine(self.url)
        except Exception as exc:  # bad URL, missing driver
            raise StoreError(f"cannot open database {self.url!r}: {exc}") from exc
        self.toolchain = dict(toolchain or toolchain_versions())
        if create:
            self.migrate()
        else:
            self.check_schema()

    # -- schema -----------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            if not self.engine.dialect.has_table(conn, Meta.__tablename__):
                return 0
            value = conn.execute(select(Meta.value).where(Meta.name == "schema_version")).scalar()
            return int(value) if value is not None else 0

    def check_schema(self) -> None:
        version = self.schema_version()
        if version != SCHEMA_VERSION:
            raise StoreError(f"database {self.url} has schema version {version}, "
                             f"this kdispatch reads version {SCHEMA_VERSION}")

    def migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION; refuse a newer one."""
        if self.schema_version() == SCHEMA_VERSION:
            return
        with self._write():
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise StoreError(f"database {self.url} has schema version {current}, newer than "
                                 f"{SCHEMA_VERSION}: upgrade kdispatch")
            for target in range(current + 1, SCHEMA_VERSION + 1):
                with self.engine.begin() as conn:
                    MIGRATIONS[target](conn)
                    conn.execute(Meta.__table__.delete().where(Meta.name == "schema_version"))
                    conn.execute(Meta.__table__.insert().values(name="schema_version",
                                                                value=str(target)))
                log.info("database %s migrated to schema version %d", self.url, target)

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        with self._thread_lock:
            if self._lock is None:
                yield
            else:
                # Writes hold the lock for ~1 ms: poll often rather than the 50 ms default.
                self._lock.acquire(poll_interval=0.002)
                try:
                    yield
                finally:
                    self._lock.release()

    # -- runs -------------------------------------------------------------------------------
    def start_run(self, device: Any, source_hashes: Mapping[str, str]) -> int:
        with self._write(), Session(self.engine) as s, s.begin():
            run = TuningRun(device_key=device.key, device_name=device.name, vendor=device.vendor,
                            arch=device.arch, cu_count=device.cu_count,
                            kdispatch_version=self.toolchain["kdispatch"],
                            torch_version=self.toolchain["torch"],
                            triton_version=self.toolchain["triton"],
                            source_hashes=canonical_json(dict(source_hashes)),
                            host=socket.gethostname()[:128], pid=os.getpid())
            s.add(run)
            s.flush()
            return run.id

    def finish_run(self, run_id: int, status: str) -> None:
        with self._write(), Session(self.engine) as s, s.begin():
            run = s.get(TuningRun, run_id)
            if run is not None:
                run.status = status
                run.finished_at = _now()

    def runs(self) -> list[TuningRun]:
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(TuningRun).order_by(TuningRun.id)))

    # -- measurements -----------------------------------------------------------------------
    def record(self, m: MeasurementIn, run_id: int | None = None) -> bool:
        """Commit one measurement. False if an identical one exists (another tuner won)."""
        key = m.key
        row = Measurement(
            run_id=run_id, op=m.op, device_key=key["device"], vendor=key["vendor"],
            arch=key["arch"], cu_count=key["cu_count"], dtype=key.get("dtype"),
            key_json=canonical_json(key), key_digest=digest(key),
            config_json=canonical_json(m.config), config_digest=digest(m.config),
            source_hash=m.source_hash, kdispatch_version=self.toolchain["kdispatch"],
            torch_version=self.toolchain["torch"], triton_version=self.toolchain["triton"],
            status=m.status, verified=m.verified, is_heuristic=m.is_heuristic,
            is_baseline=m.is_baseline,
            median_us=m.median_us, p20_us=m.p20_us, p80_us=m.p80_us, max_error=m.max_error,
            error=(m.error or None) and m.error[:4000])
        for col in KEY_INT_COLUMNS[1:]:
            if col in key:
                setattr(row, col, int(key[col]))
        try:
            with self._write(), Session(self.engine) as s, s.begin():
                s.add(row)
        except IntegrityError:
            return False
        return True

    def measured_configs(self, op: str, key: Mapping[str, Any], source_hash: str) -> set[str]:
        """Config digests already measured for this key, source hash and toolchain."""
        with Session(self.engine) as s:
            rows = s.scalars(select(Measurement.config_digest).where(
                Measurement.op == op, Measurement.key_digest == digest(key),
                Measurement.device_key == key["device"],
                Measurement.source_hash == source_hash,
                Measurement.torch_version == self.toolchain["torch"],
                Measurement.triton_version == self.toolchain["triton"]))
            return set(rows)

    def measurements(self, op: str | None = None, device_key: str | None = None,
                     key_digest: str | None = None) -> list[Measurement]:
        q = select(Measurement).order_by(Measurement.id)
        if op:
            q = q.where(Measurement.op == op)
        if device_key:
            q = q.where(Measurement.device_key == device_key)
        if key_digest:
            q = q.where(Measurement.key_digest == key_digest)
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(q))

    def best(self, device_key: str | None = None, op: str | None = None) -> list[BestRow]:
        """The fastest verified measurement per (op, device, key, source hash).

        Comparison-only baseline rows are never a best config. Ties on time go to the lowest id, so every reader gets the same answer.
        """
        ok = (Measurement.status == "ok") & Measurement.verified.is_(True) & \
            Measurement.median_us.is_not(None) & Measurement.is_baseline.is_(False)
        q = select(Measurement).where(ok)
        if device_key:
            q = q.where(Measurement.device_key == device_key)
        if op:
            q = q.where(Measurement.op == op)
        q = q.order_by(Measurement.median_us, Measurement.id)
        best: dict[tuple[str, str, str, str], BestRow] = {}
        with Session(self.engine) as s:
            for m in s.scalars(q):
                k = (m.op, m.device_key, m.key_digest, m.source_hash)
                if k not in best:
                    best[k] = BestRow(op=m.op, device_key=m.device_key,
                                      key=json.loads(m.key_json), key_digest=m.key_digest,
                                      config=json.loads(m.config_json), median_us=m.median_us,
                                      source_hash=m.source_hash, torch_version=m.torch_version,
                                      triton_version=m.triton_version)
        return sorted(best.values(), key=lambda r: (r.op, r.device_key, r.key_digest))

    def config_times(self, device_key: str | None = None,
                     ) -> dict[tuple[str, str, str, str], float]:
        """Fastest verified time per (op, key digest, source hash, config digest)."""
        q = select(Measurement.op, Measurement.key_digest, Measurement.source_hash,
                   Measurement.config_digest, func.min(Measurement.median_us)).where(
            Measurement.status == "ok", Measurement.verified.is_(True),
            Measurement.median_us.is_not(None)).group_by(
            Measurement.op, Measurement.key_digest, Measurement.source_hash,
            Measurement.config_digest)
        if device_key:
            q = q.where(Measurement.device_key == device_key)
        with Session(self.engine) as s:
            return {(op, kd, sh, cd): us for op, kd, sh, cd, us in s.execute(q)}

    def counts(self) -> dict[str, int]:
        with Session(self.engine) as s:
            return {
                "runs": s.scalar(select(func.count()).select_from(TuningRun)) or 0,
                "measurements": s.scalar(select(func.count()).select_from(Measurement)) or 0,
                "verified": s.scalar(select(func.count()).select_from(Measurement).where(
                    Measurement.verified.is_(True))) or 0,
                "misses": s.scalar(select(func.count()).select_from(Miss)) or 0,
            }

    # -- misses -----------------------------------------------------------------------------
    def record_miss(self, op: str, key: Mapping[str, Any]) -> bool:
        """Record a key resolved by heuristic (deduplicated). True if it was new."""
        row = Miss(op=op, device_key=key["device"], key_json=canonical_json(key),
                   key_digest=digest(key))
        try:
            with self._write(), Session(self.engine) as s, s.begin():
                s.add(row)
        except IntegrityError:
            return False
        return True

    def misses(self, device_key: str | None = None,
               include_tuned: bool = False) -> list[tuple[str, dict[str, Any]]]:
        q = select(Miss).order_by(Miss.id)
        if device_key:
            q = q.where(Miss.device_key == device_key)
        if not include_tuned:
            q = q.where(Miss.tuned.is_(False))
        with Session(self.engine) as s:
            return [(m.op, json.loads(m.key_json)) for m in s.scalars(q)]

    def mark_miss_tuned(self, op: str, key: Mapping[str, Any]) -> None:
        with self._write(), Session(self.engine) as s, s.begin():
            for m in s.scalars(select(Miss).where(Miss.op == op,
                                                  Miss.key_digest == digest(key))):
                m.tuned = True

    def dispose(self) -> None:
        self.engine.dispose()


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def toolchain_versions() -> dict[str, str]:
    """Versions that invalidate a measurement: kdispatch, torch, triton."""
    from kdispatch._version import __version__

    try:
        import torch
        torch_v = str(torch.__version__)
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_v = "none"
    try:
        import triton
        triton_v = str(triton.__version__)
    except ImportError:  # pragma: no cover
        triton_v = "none"
    return {"kdispatch": __version__, "torch": torch_v, "triton": triton_v}


def read_best_snapshot(url: str, device_key: str) -> list[BestRow]:
    """Best rows for one device, read once by a serving process. Never creates a file."""
    store = Store(url, create=False)
    try:
        return store.best(device_key=device_key)
    finally:
        store.dispose()
