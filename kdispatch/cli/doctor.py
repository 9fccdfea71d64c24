"""``kdispatch doctor``: the device, versions, database, tables, ops and plugins in use."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import click

from kdispatch.cli.common import one_line, open_store


@click.command()
@click.option("--db", default=None, help="Database URL or SQLite path (default: KDISPATCH_DB).")
def doctor(db: str | None) -> None:
    """Report the device, versions, database, shipped tables and recorded misses.

    \b
    Example:
      kdispatch doctor
    """
    from kdispatch.device import Device
    from kdispatch.settings import db_url
    from kdispatch.store import sqlite_path, toolchain_versions

    say = click.echo
    try:
        dev = Device.current()
        say(f"device: {dev.name} key={dev.key} vendor={dev.vendor} arch={dev.arch} "
            f"cu_count={dev.cu_count}")
    except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
        dev = None
        say(f"device: not detected ({type(exc).__name__}: {exc})")
    versions = toolchain_versions()
    say(f"versions: kdispatch {versions['kdispatch']}, torch {versions['torch']}, triton "
        f"{versions['triton']}, python {platform.python_version()}")
    say(f"triton interpreter: {'on' if os.environ.get('TRITON_INTERPRET') == '1' else 'off'}")
    from kdispatch.integrations.vllm import entry_point_status

    say(f"vllm plugin: {entry_point_status()}")
    say(f"native launch cache: {_native_status()}")
    url = db_url(db)
    path = sqlite_path(url)
    say(f"database: {url}")
    if path is not None and not path.exists():
        say("  (no database file yet: run `kdispatch tune` or `kdispatch import`)")
    else:
        try:
            store = open_store(db, create=False)
            counts = store.counts()
            say("  rows: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
            misses = store.misses(include_tuned=True)
            pending = store.misses()
            by: dict[str, int] = {}
            for op, key in pending:
                name = f"{op}@{key.get('device')}"
                by[name] = by.get(name, 0) + 1
            say(f"misses: {len(misses)} recorded, {len(pending)} not yet tuned"
                + (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(by.items())) + ")"
                   if by else ""))
            store.dispose()
        except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
            say(f"  unusable: {one_line(exc)}")
    say("tables:")
    for line in _table_report(dev.key if dev else None):
        say(f"  {line}")


def _table_report(device_key: str | None) -> list[str]:
    from kdispatch.paths import table_dirs
    from kdispatch.registry import all_ops
    from kdispatch.tables import read_table, validate_entries

    dirs: list[Path] = []
    for o in all_ops():
        dirs.extend(d for d in table_dirs(o.table_dirs) if d not in dirs)
    lines: list[str] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(Path(d).glob("*.json")):
            try:
                table = read_table(path)
                good, rejected = validate_entries(table)
            except (ValueError, OSError) as exc:
                lines.append(f"{path}: MALFORMED: {str(exc).splitlines()[0][:200]}")
                continue
            stale = sum(not c.current for c in good)
            problems = []
            if path.stem != table.device.key:
                problems.append(f"file name does not match its device {table.device.key!r}")
            if rejected:
                problems.append(f"{len(rejected)} invalid entries")
            if stale:
                problems.append(f"{stale} stale entries (kernel source changed)")
            if device_key is not None and table.device.key != device_key:
                problems.append(f"other device (this one is {device_key})")
            use = "in use" if device_key == table.device.key and not rejected else "not in use"
            lines.append(f"{path}: {len(table.entries)} entries, device {table.device.key}, "
                         f"{use}" + ("; " + "; ".join(problems) if problems else ""))
    return lines or ["none found in " + ", ".join(str(d) for d in table_dirs())]




def _native_status() -> str:
    from kdispatch.native.build import enabled, library_path, loaded

    path = library_path()
    if not enabled():
        return "off (KDISPATCH_FAST_OPS=0)"
    if loaded() is not None:
        return f"loaded ({loaded()})"
    if path.is_file():
        return f"built ({path}); loaded by processes that import kdispatch"
    return "not built (`kdispatch build-ops` builds it)"
