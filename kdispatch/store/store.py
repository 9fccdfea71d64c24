"""The :class:`Store`: one handle on a tuning database (SQLite file or a server)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from filelock import FileLock
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from kdispatch.errors import StoreError
from kdispatch.settings import db_url as _db_url
from kdispatch.store.engine import file_identity, make_engine, sqlite_path
from kdispatch.store.host import alive, toolchain_versions
from kdispatch.store.rows import BestRow, MeasurementIn, canonical_json, digest, json_object
from kdispatch.store.schema import (MIGRATIONS, SCHEMA_VERSION, Measurement, Meta, Miss,
                                    TuningRun, now)

log = logging.getLogger(__name__)


def _cause(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0][:300]}" if text else type(orig).__name__


class Store:
    """A handle on one tuning database. Thread-safe; cheap to keep for a process.

    Every failure of the database itself (a directory or garbage where the file should
    be, a read-only or full disk, an unreachable or silent server, a dropped table)
    raises :class:`~kdispatch.errors.StoreError` naming the database and the cause.
    """

    def __init__(self, url: str | None = None, *, create: bool = True,
                 toolchain: Mapping[str, str] | None = None):
        self.url = _db_url(url)
        self.path = sqlite_path(self.url)
        self.toolchain = dict(toolchain or toolchain_versions())
        self._thread_lock = threading.RLock()
        self._recorded: dict[int, int] = {}  # run id -> measurements this handle committed
        self.skipped_rows = 0  # rows best() could not read (not JSON objects)
        if self.path is not None:
            if self.path.is_dir():
                raise StoreError(f"database {self.path}: is a directory, not a SQLite file")
            if not create and not self.path.exists():
                raise StoreError(f"database {self.path} does not exist")
            if create:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StoreError(f"database {self.path}: cannot create its directory: "
                                     f"{exc.strerror or exc}") from None
        self._lock = FileLock(str(self.path) + ".lock", timeout=120) if self.path else None
        try:
            self.engine = make_engine(self.url)
        except Exception as exc:  # noqa: BLE001 - bad URL, missing driver
            raise StoreError(f"cannot open database {self.url}: {_cause(exc)}") from exc
        self._identity = None
        with self._guard():
            if create:
                self.migrate()
                self._check_tables()
                self._check_writable()
            else:
                self.check_schema()
        self._identity = file_identity(self.path) if self.path else None

    @property
    def name(self) -> str:
        """The database as a user names it: the file path or the URL without password."""
        if self.path is not None:
            return str(self.path)
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (SQLAlchemyError, OSError) as exc:
            raise StoreError(f"database {self.name}: {_cause(exc)}") from exc

    # -- schema -----------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._guard(), self.engine.connect() as conn:
            if not self.engine.dialect.has_table(conn, Meta.__tablename__):
                return 0
            value = conn.execute(select(Meta.value).where(Meta.name == "schema_version")).scalar()
            try:
                return int(value) if value is not None else 0
            except ValueError:
                raise StoreError(f"database {self.name}: schema version {value!r} is not a "
                                 "number") from None

    def check_schema(self) -> None:
        version = self.schema_version()
        if version != SCHEMA_VERSION:
            raise StoreError(f"database {self.name}: schema version {version}, this kdispatch "
                             f"reads version {SCHEMA_VERSION}")
        self._check_tables()

    def _check_tables(self) -> None:
        with self._guard(), self.engine.connect() as conn:
            for table in (TuningRun.__tablename__, Measurement.__tablename__,
                          Miss.__tablename__):
                if not self.engine.dialect.has_table(conn, table):
                    raise StoreError(f"database {self.name}: table {table} is missing (dropped "
                                     "or never created): restore it or use another database")

    def _check_writable(self) -> None:
        """A no-op write, so a read-only or locked-out database fails at open, not at the
        first measurement of a tune."""
        with self._write(), self.engine.begin() as conn:
            conn.execute(Meta.__table__.update().where(Meta.name == "schema_version")
                         .values(value=Meta.value))

    def migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION; refuse a newer one."""
        if self.schema_version() == SCHEMA_VERSION:
            return
        with self._write():
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise StoreError(f"database {self.name}: schema version {current}, newer than "
                                 f"{SCHEMA_VERSION}: upgrade kdispatch")
            for target in range(current + 1, SCHEMA_VERSION + 1):
                with self.engine.begin() as conn:
                    MIGRATIONS[target](conn)
                    conn.execute(Meta.__table__.delete().where(Meta.name == "schema_version"))
                    conn.execute(Meta.__table__.insert().values(name="schema_version",
                                                                value=str(target)))
                log.info("database %s migrated to schema version %d", self.name, target)

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        with self._thread_lock, self._guard():
            if self._lock is None:
                yield
                return
            # Writes hold the lock for ~1 ms: poll often rather than the 50 ms default.
            self._lock.acquire(poll_interval=0.002)
            try:
                self._check_identity()
                yield
            finally:
                self._lock.release()

    def _check_identity(self) -> None:
        """A SQLite file deleted, renamed or replaced under this handle is an error (rows
        written now would go to a file nobody reads)."""
        if self.path is None or self._identity is None:
            return
        if file_identity(self.path) != self._identity:
            raise StoreError(f"database {self.path}: the file was deleted, renamed or "
                             "replaced while in use; rows written since are not in it")

    # -- runs -------------------------------------------------------------------------------
    def start_run(self, device: Any, source_hashes: Mapping[str, str]) -> int:
        self.mark_dead_runs()
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
            self._recorded[run.id] = 0
            return run.id

    def mark_dead_runs(self) -> int:
        """Mark ``killed`` the runs of this host still ``running`` whose process is gone."""
        host = socket.gethostname()[:128]
        with self._write(), Session(self.engine) as s, s.begin():
            dead = 0
            for run in s.scalars(select(TuningRun).where(TuningRun.status == "running",
                                                         TuningRun.host == host)):
                if not alive(run.pid):
                    run.status, run.finished_at = "killed", now()
                    dead += 1
            return dead

    def finish_run(self, run_id: int, status: str) -> None:
        """Close a run; StoreError if the database lost the run or measurements it took."""
        with self._write(), Session(self.engine) as s, s.begin():
            run = s.get(TuningRun, run_id)
            if run is None:
                raise StoreError(f"database {self.name}: run {run_id} is gone (the database "
                                 "was replaced during the run)")
            run.status = status
            run.finished_at = now()
            have = s.scalar(select(func.count()).select_from(Measurement).where(
                Measurement.run_id == run_id)) or 0
        want = self._recorded.get(run_id, 0)
        if have < want:
            raise StoreError(f"database {self.name}: {want - have} of the {want} measurements "
                             f"run {run_id} committed are gone")

    def runs(self) -> list[TuningRun]:
        with self._guard(), Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(TuningRun).order_by(TuningRun.id)))

    # -- measurements -----------------------------------------------------------------------
    def record(self, m: MeasurementIn, run_id: int | None = None) -> bool:
        """Commit one measurement. False if an identical one exists (another tuner won)."""
        key = m.key
        row = Measurement(
            run_id=run_id, op=m.op, device_key=key["device"], vendor=key["vendor"],
            arch=key["arch"], cu_count=key["cu_count"],
            key_json=canonical_json(key), key_digest=digest(key),
            config_json=canonical_json(m.config), config_digest=digest(m.config),
            source_hash=m.source_hash, kdispatch_version=self.toolchain["kdispatch"],
            torch_version=self.toolchain["torch"], triton_version=self.toolchain["triton"],
            status=m.status, verified=m.verified, is_heuristic=m.is_heuristic,
            is_baseline=m.is_baseline, imported=m.imported,
            median_us=m.median_us, p20_us=m.p20_us, p80_us=m.p80_us, max_error=m.max_error,
            error=(m.error or None) and m.error[:4000])
        if not self._insert(row):
            return False
        if run_id is not None:
            self._recorded[run_id] = self._recorded.get(run_id, 0) + 1
        return True

    def measured_configs(self, op: str, key: Mapping[str, Any], source_hash: str) -> set[str]:
        """Config digests already measured for this key, source hash and toolchain."""
        with self._guard(), Session(self.engine) as s:
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
        with self._guard(), Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(q))

    def ranked(self, device_key: str | None = None, op: str | None = None) -> list[BestRow]:
        """Every verified, servable row, best first per key: measured rows before imported
        ones, then by time (ties: lowest id). Rows whose JSON is unreadable are skipped and
        counted in ``skipped_rows``."""
        ok = (Measurement.status == "ok") & Measurement.verified.is_(True) & \
            Measurement.median_us.is_not(None) & Measurement.is_baseline.is_(False)
        q = select(Measurement).where(ok)
        if device_key:
            q = q.where(Measurement.device_key == device_key)
        if op:
            q = q.where(Measurement.op == op)
        q = q.order_by(Measurement.imported, Measurement.median_us, Measurement.id)
        out: list[BestRow] = []
        self.skipped_rows = 0
        with self._guard(), Session(self.engine) as s:
            for m in s.scalars(q):
                try:
                    key = json_object(m.key_json, "key")
                    config = json_object(m.config_json, "config")
                except ValueError:
                    self.skipped_rows += 1
                    continue
                out.append(BestRow(op=m.op, device_key=m.device_key, key=key,
                                   key_digest=m.key_digest, config=config,
                                   median_us=m.median_us, source_hash=m.source_hash,
                                   torch_version=m.torch_version,
                                   triton_version=m.triton_version, imported=m.imported))
        return out

    def best(self, device_key: str | None = None, op: str | None = None) -> list[BestRow]:
        """The first of :meth:`ranked` per (op, device, key, source hash)."""
        best: dict[tuple[str, str, str, str], BestRow] = {}
        for r in self.ranked(device_key, op):
            best.setdefault((r.op, r.device_key, r.key_digest, r.source_hash), r)
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
        with self._guard(), Session(self.engine) as s:
            return {(op, kd, sh, cd): us for op, kd, sh, cd, us in s.execute(q)}

    def counts(self) -> dict[str, int]:
        with self._guard(), Session(self.engine) as s:
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
        return self._insert(Miss(op=op, device_key=key["device"],
                                 key_json=canonical_json(key), key_digest=digest(key)))

    def _insert(self, row: Any) -> bool:
        """Commit one new row; False when a unique constraint says it is already there."""
        try:
            with self._write(), Session(self.engine) as s, s.begin():
                s.add(row)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                return False
            raise
        return True

    def misses(self, device_key: str | None = None,
               include_tuned: bool = False) -> list[tuple[str, dict[str, Any]]]:
        q = select(Miss).order_by(Miss.id)
        if device_key:
            q = q.where(Miss.device_key == device_key)
        if not include_tuned:
            q = q.where(Miss.tuned.is_(False))
        out = []
        with self._guard(), Session(self.engine) as s:
            for m in s.scalars(q):
                try:
                    out.append((m.op, json_object(m.key_json, "miss")))
                except ValueError:
                    continue
        return out

    def mark_miss_tuned(self, op: str, key: Mapping[str, Any]) -> None:
        with self._write(), Session(self.engine) as s, s.begin():
            for m in s.scalars(select(Miss).where(Miss.op == op,
                                                  Miss.key_digest == digest(key))):
                m.tuned = True

    def dispose(self) -> None:
        self.engine.dispose()


def read_best_snapshot(url: str, device_key: str) -> list[BestRow]:
    """Best rows for one device, read once by a serving process. Never creates a file."""
    store = Store(url, create=False)
    try:
        return store.best(device_key=device_key)
    finally:
        store.dispose()
