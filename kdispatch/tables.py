"""Shipped dispatch tables: one JSON file per device key (``<device-key>.json``).

A table is data, never code: it is read only from a regular file under a size cap, parsed
with a nesting cap, validated with pydantic, and every entry's key and config are
re-validated by the op's own models and validity check, so a hostile table cannot reach a
launch (entries that fail are dropped with a warning). Each entry carries the source hash
it was tuned with; an entry whose hash no longer matches the installed op is stale and not
used. Export, import and merge validate every entry that enters or leaves.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import stat
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kdispatch.device import Device
from kdispatch.errors import short_error
from kdispatch.registry import get_op, op_names
from kdispatch.store.rows import MAX_JSON_DEPTH, digest, json_depth

TABLE_FORMAT_VERSION = 1
MAX_TABLE_BYTES = 64 << 20
#: envelope + entries + key/config objects
MAX_TABLE_DEPTH = 3 + MAX_JSON_DEPTH


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
    median_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    heuristic_us: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class TableFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    format_version: Literal[1]
    device: Device
    toolchain: Toolchain
    created: str = Field(max_length=64)
    source_hashes: dict[str, str] = Field(default_factory=dict)
    entries: list[TableEntry]


def read_table(path: Path | str) -> TableFile:
    """Parse and validate a table file's envelope. Raises ValueError on any defect."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"table {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"table {path}: not a regular file")
    if st.st_size > MAX_TABLE_BYTES:
        raise ValueError(f"table {path} is {st.st_size} bytes, over the {MAX_TABLE_BYTES} limit")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TABLE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"table {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TABLE_BYTES:
        raise ValueError(f"table {path} is over the {MAX_TABLE_BYTES}-byte limit")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"table {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"table {path} is nested too deeply") from None
    if json_depth(raw, MAX_TABLE_DEPTH) > MAX_TABLE_DEPTH:
        raise ValueError(f"table {path} is nested deeper than {MAX_TABLE_DEPTH} levels")
    if not isinstance(raw, dict):
        raise ValueError(f"table {path}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("format_version") != TABLE_FORMAT_VERSION:
        raise ValueError(f"table {path} has format_version {raw.get('format_version')!r}; "
                         f"this kdispatch reads {TABLE_FORMAT_VERSION}")
    try:
        return TableFile.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"table {path} is malformed: {short_error(exc)}") from None


@dataclass(frozen=True)
class Checked:
    """One entry that passed validation: the entry, its parsed config, its key digest."""

    entry: TableEntry
    config: Any
    key_digest: str
    current: bool  # tuned with the installed op's source hash


def check_entry(e: TableEntry, device_key: str) -> Checked:
    """Validate one entry against its op; ValueError naming what is wrong."""
    op = get_op(e.op)
    key = op.parse_key(e.key)
    if key.device != device_key:
        raise ValueError(f"key is for device {key.device!r}, the table for {device_key!r}")
    config = op.parse_config(e.config)
    op.check_config(key, config, served=True)
    return Checked(e, config, digest(key.model_dump(mode="json")),
                   e.source_hash == op.source_hash())


def validate_entries(table: TableFile, ops: Iterable[str] | None = None,
                     ) -> tuple[list[Checked], list[str]]:
    """The entries (of ``ops``, when given) that validate, and why the others did not."""
    wanted = set(ops) if ops is not None else None
    good: list[Checked] = []
    rejected: list[str] = []
    for i, e in enumerate(table.entries):
        if wanted is not None and e.op not in wanted:
            continue
        try:
            good.append(check_entry(e, table.device.key))
        except (ValueError, ValidationError) as exc:
            rejected.append(f"entry {i} ({e.op}): {short_error(exc)}")
    return good, rejected


@dataclass
class LoadReport:
    """What loading one table for one op kept and dropped."""

    path: Path
    kept: int = 0
    stale: int = 0
    rejected: list[str] = field(default_factory=list)
    stale_keys: set[str] = field(default_factory=set)  # key digests of the stale entries


def load_for_op(table: TableFile, path: Path, op: str) -> tuple[dict[str, Any], LoadReport]:
    """{key digest: config} of ``op``'s current, valid entries, and a report."""
    good, rejected = validate_entries(table, [op])
    report = LoadReport(path=path, rejected=rejected)
    out: dict[str, Any] = {}
    for c in good:
        if not c.current:
            report.stale += 1
            report.stale_keys.add(c.key_digest)
            continue
        out.setdefault(c.key_digest, c.config)
    report.kept = len(out)
    return out, report


# -- export / import / merge ------------------------------------------------------------------
def heuristic_time(times: dict[tuple[str, str, str, str], float], row: Any) -> float | None:
    """The measured time of today's heuristic config for a best row's key, if measured."""
    if row.op not in op_names():
        return None
    op = get_op(row.op)
    try:
        cfg = op.heuristic(op.parse_key(row.key))
    except (ValueError, ValidationError):
        return None
    return times.get((row.op, row.key_digest, row.source_hash,
                      digest(cfg.model_dump(mode="json"))))


def export_table(store: Any, device: Device, path: Path | str | None = None,
                 ops: Iterable[str] | None = None) -> tuple[TableFile, list[str]]:
    """The best *valid* verified row per key of ``device`` (current source hashes only) as
    a table, and the rows passed over (invalid configs, unknown ops); written to ``path``
    if given."""
    from kdispatch.store import toolchain_versions

    wanted = set(ops) if ops else None
    hashes: dict[str, str] = {}
    chosen: dict[tuple[str, str], TableEntry] = {}
    skipped: list[str] = []
    versions: Counter[tuple[str, str]] = Counter()
    times = store.config_times(device.key)
    for row in store.ranked(device_key=device.key):
        if wanted is not None and row.op not in wanted:
            continue
        if (row.op, row.key_digest) in chosen:
            continue
        if row.op not in op_names():
            skipped.append(f"{row.op}: unknown op")
            continue
        current = hashes.setdefault(row.op, get_op(row.op).source_hash())
        if row.source_hash != current:
            continue
        entry = TableEntry(op=row.op, key=row.key, config=row.config,
                           source_hash=row.source_hash, median_us=row.median_us,
                           heuristic_us=heuristic_time(times, row))
        try:
            check_entry(entry, device.key)
        except (ValueError, ValidationError) as exc:
            skipped.append(f"{row.op} {row.key_digest[:8]}: {short_error(exc)}")
            continue
        versions[(row.torch_version, row.triton_version)] += 1
        chosen[(row.op, row.key_digest)] = entry
    toolchain = toolchain_versions()  # the tuner's torch/triton, not the exporting host's
    if versions:
        toolchain["torch"], toolchain["triton"] = versions.most_common(1)[0][0]
    table = TableFile(format_version=TABLE_FORMAT_VERSION, device=device,
                      toolchain=Toolchain(**toolchain),
                      created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                      source_hashes=dict(sorted(hashes.items())),
                      entries=sorted(chosen.values(), key=lambda e: (e.op, digest(e.key))))
    if path is not None:
        write_table(table, path)
    return table, skipped


def write_table(table: TableFile, path: Path | str) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(table.model_dump_json(indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def import_table(path: Path | str, store: Any, *, as_measured: bool = False,
                 ) -> tuple[int, list[str]]:
    """Insert a table's valid, current entries into ``store``.

    Rows are marked imported: a row measured on this database outranks them, unless
    ``as_measured``. Returns (rows inserted, refusal messages); entries already present
    are skipped silently.
    """
    from kdispatch.store import MeasurementIn

    table = read_table(path)
    good, refused = validate_entries(table)
    inserted = 0
    for c in good:
        e = c.entry
        if not c.current:
            refused.append(f"{e.op} {c.key_digest[:8]}: tuned with other kernel sources "
                           f"({e.source_hash}); stale")
            continue
        if e.median_us is None or not math.isfinite(e.median_us) or e.median_us <= 0:
            refused.append(f"{e.op} {c.key_digest[:8]}: no positive measured time "
                           f"({e.median_us!r})")
            continue
        ok = store.record(MeasurementIn(
            op=e.op, key=get_op(e.op).parse_key(e.key).model_dump(mode="json"),
            config=c.config.model_dump(mode="json"), source_hash=e.source_hash, status="ok",
            verified=True, imported=not as_measured, median_us=e.median_us, error=None))
        inserted += int(ok)
    return inserted, refused


@dataclass(frozen=True)
class MergeConflict:
    op: str
    key: dict[str, Any]
    kept: dict[str, Any]
    dropped: dict[str, Any]
    kept_us: float | None
    dropped_us: float | None


def _faster(a: TableEntry, b: TableEntry) -> bool:
    """Whether ``a`` beats ``b``: a measured time beats none, then the lower time."""
    if a.median_us is None:
        return False
    return b.median_us is None or a.median_us < b.median_us


def merge_tables(a: TableFile, b: TableFile,
                 ) -> tuple[TableFile, list[MergeConflict], list[str]]:
    """Merge two tables of one device: the fastest valid entry per key wins.

    Returns (table, conflicts, refused entries). Tables of two devices never mix: that is
    a ValueError.
    """
    if a.device.key != b.device.key:
        raise ValueError(f"cannot merge tables of {a.device.key!r} and {b.device.key!r}")
    merged: dict[tuple[str, str, str], TableEntry] = {}
    conflicts: list[MergeConflict] = []
    refused: list[str] = []
    for name, table in (("first", a), ("second", b)):
        good, bad = validate_entries(table)
        refused.extend(f"{name} table: {msg}" for msg in bad)
        for c in good:
            entry = c.entry
            k = (entry.op, c.key_digest, entry.source_hash)
            have = merged.get(k)
            if have is None:
                merged[k] = entry
                continue
            if have.config == entry.config:
                if _faster(entry, have):
                    merged[k] = entry
                continue
            win, lose = (entry, have) if _faster(entry, have) else (have, entry)
            merged[k] = win
            conflicts.append(MergeConflict(op=entry.op, key=entry.key, kept=win.config,
                                           dropped=lose.config, kept_us=win.median_us,
                                           dropped_us=lose.median_us))
    newer = b if b.created >= a.created else a
    table = TableFile(format_version=TABLE_FORMAT_VERSION, device=a.device,
                      toolchain=newer.toolchain, created=newer.created,
                      source_hashes={**a.source_hashes, **b.source_hashes},
                      entries=sorted(merged.values(), key=lambda e: (e.op, digest(e.key))))
    return table, conflicts, refused
