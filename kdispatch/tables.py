"""Shipped dispatch tables: one JSON file per device key (``db/<device-key>.json``).

A table is data, never code: it is parsed with pydantic, every entry's key and config are
re-validated by the op's own models and validity check on load, and entries that fail are
dropped with a warning, so a hostile table cannot reach a launch. Each entry carries the
kernel-source hash it was tuned with; an entry whose hash no longer matches the installed
kernels is stale and is not used.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kdispatch.device import Device
from kdispatch.errors import short_error

log = logging.getLogger(__name__)

TABLE_FORMAT_VERSION = 1
MAX_TABLE_BYTES = 64 << 20


class Toolchain(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kdispatch: str = Field(max_length=64)
    torch: str = Field(max_length=64)
    triton: str = Field(max_length=64)


class TableEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    op: str = Field(min_length=1, max_length=64)
    key: dict[str, Any]
    config: dict[str, Any]
    source_hash: str = Field(min_length=1, max_length=64)
    median_us: float | None = Field(default=None, ge=0)
    heuristic_us: float | None = Field(default=None, ge=0)


class TableFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    format_version: Literal[1]
    device: Device
    toolchain: Toolchain
    created: str = Field(max_length=64)
    source_hashes: dict[str, str] = Field(default_factory=dict)
    entries: list[TableEntry]


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def table_dirs() -> list[Path]:
    """Where tables are looked for, first match wins.

    ``KDISPATCH_TABLE_DIR`` (if set), the wheel's ``kdispatch/db``, then the source tree's
    ``db/`` (an editable install).
    """
    dirs = []
    env = os.environ.get("KDISPATCH_TABLE_DIR", "").strip()
    if env:
        dirs.append(Path(env))
    dirs.append(_package_dir() / "db")
    dirs.append(_package_dir().parent / "db")
    return dirs


def find_table_file(device_key: str) -> Path | None:
    for d in table_dirs():
        p = d / f"{device_key}.json"
        if p.is_file():
            return p
    return None


def read_table(path: Path | str) -> TableFile:
    """Parse and validate a table file's envelope. Raises ValueError on any defect."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_TABLE_BYTES:
        raise ValueError(f"table {path} is {size} bytes, over the {MAX_TABLE_BYTES} limit")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"table {path} is not valid JSON: {exc}") from None
    if isinstance(raw, dict) and raw.get("format_version") != TABLE_FORMAT_VERSION:
        raise ValueError(f"table {path} has format_version {raw.get('format_version')!r}; "
                         f"this kdispatch reads {TABLE_FORMAT_VERSION}")
    try:
        return TableFile.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"table {path} is malformed: {short_error(exc)}") from None


def shipped_device_record(device_key: str) -> Device | None:
    """The device record of the table for ``device_key``, or None if absent/unreadable."""
    path = find_table_file(device_key)
    if path is None:
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        device = Device.model_validate(raw["device"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("no device record in %s: %s", path, exc)
        return None
    return device if device.key == device_key else None


@dataclass(frozen=True)
class LoadedEntry:
    config: Any  # the op's OpConfig
    source_hash: str
    median_us: float | None


@dataclass
class LoadReport:
    """What loading one table kept and dropped (for warnings and ``kdispatch doctor``)."""

    path: Path
    kept: int = 0
    stale: int = 0
    rejected: list[str] | None = None


def validate_entries(table: TableFile, *, expect_device: str | None = None,
                     ) -> tuple[dict[tuple[str, str], tuple[TableEntry, Any]], list[str]]:
    """Check each entry against its op spec. Returns ({(op, key digest): (entry, config)},
    rejection messages)."""
    from kdispatch.registry import get_op
    from kdispatch.store import digest

    if expect_device is not None and table.device.key != expect_device:
        raise ValueError(f"table is for device {table.device.key!r}, not {expect_device!r}")
    good: dict[tuple[str, str], tuple[TableEntry, Any]] = {}
    rejected: list[str] = []
    for i, e in enumerate(table.entries):
        try:
            spec = get_op(e.op)
            key = spec.parse_key(e.key)
            if key.device != table.device.key:
                raise ValueError(f"key is for device {key.device!r}")
            config = spec.parse_config(e.config)
            spec.check_config(key, config)
        except (ValueError, ValidationError) as exc:
            first = short_error(exc)
            rejected.append(f"entry {i} ({e.op}): {first}")
            continue
        good[(e.op, digest(key.model_dump(mode="json")))] = (e, config)
    return good, rejected


def load_for_dispatch(path: Path, device_key: str,
                      ) -> tuple[dict[tuple[str, str], LoadedEntry], LoadReport]:
    """Entries usable by the dispatcher for ``device_key``; raises ValueError on a bad file."""
    from kdispatch.registry import get_op

    table = read_table(path)
    good, rejected = validate_entries(table, expect_device=device_key)
    report = LoadReport(path=path, rejected=rejected)
    out: dict[tuple[str, str], LoadedEntry] = {}
    for k, (entry, config) in good.items():
        if entry.source_hash != get_op(entry.op).source_hash():
            report.stale += 1
            continue
        out[k] = LoadedEntry(config=config, source_hash=entry.source_hash,
                             median_us=entry.median_us)
    report.kept = len(out)
    return out, report


# -- export / import / merge ------------------------------------------------------------------
def heuristic_time(times: Mapping[tuple[str, str, str, str], float], row: Any) -> float | None:
    """The measured time of today's heuristic config for a best row's key, if measured.

    ``times`` is :meth:`Store.config_times`; a database may also hold the configs an older
    heuristic chose, which say nothing about today's.
    """
    from kdispatch.registry import get_op, op_names
    from kdispatch.store import digest

    if row.op not in op_names():
        return None
    spec = get_op(row.op)
    try:
        cfg = spec.heuristic(spec.parse_key(row.key))
    except ValueError:
        return None
    return times.get((row.op, row.key_digest, row.source_hash,
                      digest(cfg.model_dump(mode="json"))))


def export_table(store: Any, device: Device, path: Path | str | None = None,
                 ops: Iterable[str] | None = None) -> TableFile:
    """The best verified row per key for ``device`` as a table (written to ``path`` if given).

    Only rows tuned with the installed kernels' source hashes are exported.
    """
    from kdispatch.registry import get_op, op_names
    from kdispatch.store import toolchain_versions

    wanted = set(ops) if ops else None
    hashes: dict[str, str] = {}
    entries = []
    versions: Counter[tuple[str, str]] = Counter()
    times = store.config_times(device.key)
    for row in store.best(device_key=device.key):
        if wanted is not None and row.op not in wanted:
            continue
        if row.op not in op_names():
            continue
        current = hashes.setdefault(row.op, get_op(row.op).source_hash())
        if row.source_hash != current:
            continue
        versions[(row.torch_version, row.triton_version)] += 1
        entries.append(TableEntry(op=row.op, key=row.key, config=row.config,
                                  source_hash=row.source_hash, median_us=row.median_us,
                                  heuristic_us=heuristic_time(times, row)))
    toolchain = toolchain_versions()  # the tuner's torch/triton, not the exporting host's
    if versions:
        toolchain["torch"], toolchain["triton"] = versions.most_common(1)[0][0]
    table = TableFile(format_version=TABLE_FORMAT_VERSION, device=device,
                      toolchain=Toolchain(**toolchain),
                      created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                      source_hashes=hashes, entries=entries)
    if path is not None:
        write_table(table, path)
    return table


def write_table(table: TableFile, path: Path | str) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(table.model_dump_json(indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def import_table(path: Path | str, store: Any) -> tuple[int, list[str]]:
    """Insert a table's valid entries into ``store`` as verified measurements.

    Returns (rows inserted, rejection messages). Rows already present are skipped.
    """
    from kdispatch.store import MeasurementIn

    table = read_table(path)
    good, rejected = validate_entries(table)
    inserted = 0
    for entry, config in good.values():
        ok = store.record(MeasurementIn(
            op=entry.op, key=entry.key, config=config.model_dump(mode="json"),
            source_hash=entry.source_hash, status="ok", verified=True,
            median_us=entry.median_us if entry.median_us is not None else float("inf"),
            error=None))
        inserted += int(ok)
    return inserted, rejected


@dataclass(frozen=True)
class MergeConflict:
    op: str
    key: Mapping[str, Any]
    kept: Mapping[str, Any]
    dropped: Mapping[str, Any]
    kept_us: float | None
    dropped_us: float | None


def merge_tables(a: TableFile, b: TableFile) -> tuple[TableFile, list[MergeConflict]]:
    """Merge two tables of one device: the fastest verified entry per key wins.

    Entries of a different device key are never mixed: that is a ValueError.
    """
    from kdispatch.store import digest

    if a.device.key != b.device.key:
        raise ValueError(f"cannot merge tables of {a.device.key!r} and {b.device.key!r}")
    inf = float("inf")
    merged: dict[tuple[str, str, str], TableEntry] = {}
    conflicts: list[MergeConflict] = []
    for entry in [*a.entries, *b.entries]:
        k = (entry.op, digest(entry.key), entry.source_hash)
        have = merged.get(k)
        if have is None:
            merged[k] = entry
            continue
        if have.config == entry.config:
            if (entry.median_us or inf) < (have.median_us or inf):
                merged[k] = entry
            continue
        win, lose = (entry, have) if (entry.median_us or inf) < (have.median_us or inf) \
            else (have, entry)
        merged[k] = win
        conflicts.append(MergeConflict(op=entry.op, key=entry.key, kept=win.config,
                                       dropped=lose.config, kept_us=win.median_us,
                                       dropped_us=lose.median_us))
    newer = b if b.created >= a.created else a
    table = TableFile(format_version=TABLE_FORMAT_VERSION, device=a.device,
                      toolchain=newer.toolchain, created=newer.created,
                      source_hashes={**a.source_hashes, **b.source_hashes},
                      entries=sorted(merged.values(), key=lambda e: (e.op, digest(e.key))))
    return table, conflicts
