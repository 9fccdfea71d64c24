"""The tuning database's tables and migrations (SQLAlchemy 2.x ORM).

Keys are stored generically: the device fields as columns (every op's key has them), the
whole key as canonical JSON and its digest (indexed), which is what lookups match on. A
new op therefore needs no schema change.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint, inspect, text)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 2


def now() -> dt.datetime:
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
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # running | done | stopped | interrupted | failed | killed (seen dead by a later run)
    status: Mapped[str] = mapped_column(String(16), default="running")


class Measurement(Base):
    __tablename__ = "kd_measurements"
    __table_args__ = (
        UniqueConstraint("op", "device_key", "key_digest", "config_digest", "source_hash",
                         "torch_version", "triton_version", name="uq_measurement"),
        Index("ix_kd_measurements_lookup", "device_key", "op", "key_digest"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("kd_runs.id"), nullable=True)
    op: Mapped[str] = mapped_column(String(64), index=True)
    device_key: Mapped[str] = mapped_column(String(64), index=True)
    vendor: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(32))
    cu_count: Mapped[int] = mapped_column(Integer)
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
    # came from `kdispatch import` (a table's timing, not measured here): a row measured on
    # this database's devices outranks it
    imported: Mapped[bool] = mapped_column(Boolean, default=False)
    median_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    p20_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    p80_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class Miss(Base):
    __tablename__ = "kd_misses"
    __table_args__ = (UniqueConstraint("op", "device_key", "key_digest", name="uq_miss"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    op: Mapped[str] = mapped_column(String(64))
    device_key: Mapped[str] = mapped_column(String(64), index=True)
    key_json: Mapped[str] = mapped_column(Text)
    key_digest: Mapped[str] = mapped_column(String(32))
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime, default=now)
    tuned: Mapped[bool] = mapped_column(Boolean, default=False)


# Ordered migrations: target version -> function(connection).
def _migrate_to_1(conn: Any) -> None:
    Base.metadata.create_all(conn)


def _migrate_to_2(conn: Any) -> None:
    """Version 1 kept op-specific typed key columns (left in place, unused, all nullable)
    and had no ``imported`` flag or lookup index."""
    cols = {c["name"] for c in inspect(conn).get_columns(Measurement.__tablename__)}
    if "imported" not in cols:
        conn.execute(text(f"ALTER TABLE {Measurement.__tablename__} "
                          "ADD COLUMN imported BOOLEAN NOT NULL DEFAULT FALSE"))
    indexes = {i["name"] for i in inspect(conn).get_indexes(Measurement.__tablename__)}
    if "ix_kd_measurements_lookup" not in indexes:
        Index("ix_kd_measurements_lookup", Measurement.device_key, Measurement.op,
              Measurement.key_digest).create(conn)


MIGRATIONS: dict[int, Any] = {1: _migrate_to_1, 2: _migrate_to_2}
