"""``kdispatch show``, ``export``, ``import`` and ``merge``: tuned rows and shipped tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kdispatch.cli.common import (compact, console, domain_errors, known_device, open_store,
                                  shape_fields, split, us)

_DB_HELP = "Database URL or SQLite path (default: KDISPATCH_DB)."


def _state(op: str, source_hash: str) -> str:
    from kdispatch.registry import get_op

    try:
        return "current" if source_hash == get_op(op).source_hash() else "stale"
    except ValueError:
        return "unknown op"


def _table_rows(device: str | None, op: str | None) -> list[tuple[Any, ...]]:
    """(op, device, key, config, us, heuristic us, state, source) of shipped table entries."""
    from kdispatch.paths import table_dirs
    from kdispatch.registry import all_ops
    from kdispatch.tables import read_table

    dirs: list[Path] = []
    for o in all_ops():
        dirs.extend(d for d in table_dirs(o.table_dirs) if d not in dirs)
    rows, seen = [], set()
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.json")):
            if device is not None and path.stem != device:
                continue
            try:
                table = read_table(path)
            except ValueError:
                continue  # kdispatch doctor reports unusable tables
            for e in table.entries:
                if op is not None and e.op != op:
                    continue
                k = (e.op, table.device.key, str(sorted(e.key.items())))
                if k in seen:
                    continue
                seen.add(k)
                rows.append((e.op, table.device.key, compact(shape_fields(e.key)),
                             compact(e.config), us(e.median_us), us(e.heuristic_us),
                             _state(e.op, e.source_hash), f"table {path.name}"))
    return rows


@click.command()
@click.option("--device", default=None, help="Device key (default: every device).")
@click.option("--op", default=None, help="Only this op.")
@click.option("--db", default=None, help=_DB_HELP)
def show(device: str | None, op: str | None, db: str | None) -> None:
    """List the tuned entries: the database's fastest verified config per key and the
    shipped tables' entries, each with its source and whether it is current.

    \b
    Examples:
      kdispatch show
      kdispatch show --device nvidia-h200 --op decode_attention
    """
    from rich.table import Table

    from kdispatch.settings import db_url
    from kdispatch.store import sqlite_path
    from kdispatch.tables import heuristic_time

    with domain_errors():
        if op is not None:
            from kdispatch.registry import get_op

            get_op(op)  # a typo is an error, not "0 entries"
        path = sqlite_path(db_url(db))
        if device is not None and (db is not None and path is not None and not path.exists()):
            known_device(device)  # a typo is named before a missing database
        store = None
        if db is not None or path is None or path.exists():
            store = open_store(db, create=False)
        if device is not None:
            known_device(device, store)
        db_rows = []
        if store is not None:
            times = store.config_times(device)
            for r in store.best(device_key=device, op=op):
                db_rows.append((r.op, r.device_key, compact(shape_fields(r.key)),
                                compact(r.config), us(r.median_us),
                                us(heuristic_time(times, r)), _state(r.op, r.source_hash),
                                "database (imported)" if r.imported else "database"))
        rows = db_rows + _table_rows(device, op)
    title = f"tuned entries ({store.name if store is not None else 'no database'} and shipped " \
            "tables)"
    table = Table(title=title)
    for col in ("op", "device", "key", "config", "best us", "heuristic us", "state", "source"):
        table.add_column(col, overflow="fold", no_wrap=col in ("op", "device", "state", "source"))
    for row in rows:
        table.add_row(*row)
    out = console()
    out.print(table)
    out.print(f"{len(rows)} entries ({len(db_rows)} from the database, "
              f"{len(rows) - len(db_rows)} from shipped tables)", highlight=False)
    if store is not None and store.skipped_rows:
        out.print(f"{store.skipped_rows} database rows were unreadable and skipped",
                  highlight=False)


def _device_record(store: Any, key: str) -> Any:
    """The device as the tuner recorded it (its runs), else the built-in record."""
    from kdispatch.device import Device

    for run in reversed(store.runs()):
        if run.device_key == key:
            return Device(key=run.device_key, vendor=run.vendor, name=run.device_name,
                          arch=run.arch, cu_count=run.cu_count)
    return Device.from_key(key)


def _refused(kind: str, messages: list[str]) -> None:
    for msg in messages:
        click.echo(f"{kind}: {msg}", err=True)


@click.command()
@click.option("--device", required=True, help="Device key to export (e.g. nvidia-h200).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Table file to write.")
@click.option("--op", default=None, help="Comma-separated ops (default: all).")
@click.option("--db", default=None, help=_DB_HELP)
def export(device: str, output: str, op: str | None, db: str | None) -> None:
    """Write the best valid verified config per key of one device as a table file.

    Rows tuned with other kernel sources, or whose config no longer validates, are passed
    over (the key's next valid row is exported); passed-over rows are listed and the exit
    code is 1.

    \b
    Example:
      kdispatch export --device nvidia-h200 -o db/nvidia-h200.json
    """
    from kdispatch.tables import export_table, write_table

    with domain_errors():
        store = open_store(db, create=False)
        known_device(device, store)
        table, skipped = export_table(store, _device_record(store, device), None,
                                      split(op) or None)
        if not table.entries:
            raise click.ClickException(f"no verified rows for device {device!r} with the "
                                       f"installed kernels in {store.name}; nothing exported")
        write_table(table, output)
    _refused("skipped", skipped)
    click.echo(f"exported {len(table.entries)} entries for {device} to {output}"
               + (f" ({len(skipped)} rows passed over)" if skipped else ""))
    if skipped:
        raise SystemExit(1)


@click.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--db", default=None, help=_DB_HELP)
@click.option("--as-measured", is_flag=True,
              help="Rank the table's timings like rows measured here (by default a row "
                   "measured on this database outranks an imported one).")
def import_(file: str, db: str | None, as_measured: bool) -> None:
    """Insert a table file's valid, current entries into the database as imported rows.

    Entries that do not validate (unknown op, another device, invalid config, stale
    kernels, no positive time) are refused and listed; the exit code is then 1.

    \b
    Example:
      kdispatch import db/nvidia-h200.json --db ~/.cache/kdispatch/kdispatch.sqlite
    """
    from kdispatch.tables import import_table

    with domain_errors():
        store = open_store(db)
        inserted, refused = import_table(file, store, as_measured=as_measured)
    _refused("refused", refused)
    click.echo(f"imported {inserted} entries from {file} ({len(refused)} refused)")
    if refused:
        raise SystemExit(1)


@click.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Merged table file to write.")
def merge(a: str, b: str, output: str) -> None:
    """Merge two tables of one device: the fastest valid entry per key wins.

    Keys where the tables chose different configs are reported as conflicts; entries that
    do not validate are refused and listed, and the exit code is then 1.

    \b
    Example:
      kdispatch merge host1/nvidia-h200.json host2/nvidia-h200.json -o nvidia-h200.json
    """
    from kdispatch.tables import merge_tables, read_table, write_table

    with domain_errors():
        table, conflicts, refused = merge_tables(read_table(a), read_table(b))
        write_table(table, output)
    _refused("refused", refused)
    for c in conflicts:
        click.echo(f"conflict: {c.op} {compact(shape_fields(dict(c.key)))}: kept "
                   f"{compact(dict(c.kept))} ({us(c.kept_us)} us), dropped "
                   f"{compact(dict(c.dropped))} ({us(c.dropped_us)} us)")
    click.echo(f"merged {len(table.entries)} entries into {output} "
               f"({len(conflicts)} conflicts, {len(refused)} refused)")
    if refused:
        raise SystemExit(1)
