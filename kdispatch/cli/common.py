"""Shared pieces of the command line: one-line errors, the console, small formatters."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

DEVICE_KEY_FIELDS = ("device", "vendor", "arch", "cu_count")
DEBUG_ENV = "KDISPATCH_DEBUG"


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (pydantic errors: each field and reason)."""
    from kdispatch.errors import short_error

    return short_error(exc) or type(exc).__name__


@contextmanager
def domain_errors() -> Iterator[None]:
    """Turn any error below a command into one line (``KDISPATCH_DEBUG=1``: the traceback)."""
    try:
        yield
    except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - no traceback reaches a user
        if os.environ.get(DEBUG_ENV, "") == "1":
            raise
        raise click.ClickException(one_line(exc)) from exc


def console() -> Any:
    from rich.console import Console

    # Bound per call: CliRunner swaps sys.stdout, and a pipe (or a log) should get whole
    # table rows, not a terminal's 80 columns.
    columns = os.environ.get("COLUMNS", "")
    width = None if sys.stdout.isatty() else max(int(columns) if columns.isdigit() else 0, 220)
    return Console(file=sys.stdout, width=width, soft_wrap=False)


def split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


_OPENED: list[Any] = []


def open_store(db: str | None, create: bool = True) -> Any:
    """A Store for this command; closed (connections released, WAL checkpointed) when the
    command ends (:func:`close_stores`)."""
    from kdispatch.store import Store

    store = Store(db, create=create)
    _OPENED.append(store)
    return store


def close_stores() -> None:
    while _OPENED:
        _OPENED.pop().dispose()


def shape_fields(key: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in key.items() if k not in DEVICE_KEY_FIELDS}


def compact(data: dict[str, Any] | None) -> str:
    if not data:
        return "-"
    return " ".join(f"{k}={v}" for k, v in data.items())


def us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def known_device(key: str, store: Any = None) -> str:
    """``key`` if kdispatch knows it (built in, a shipped table or a database's runs/rows),
    else a ValueError naming the known keys (a typo must not read as "0 entries")."""
    from kdispatch.device import INTERPRETER_KEY, builtin_keys
    from kdispatch.paths import builtin_table_dirs, check_device_key, env_table_dir

    check_device_key(key)
    known = set(builtin_keys()) | {INTERPRETER_KEY}
    for d in [env_table_dir(), *builtin_table_dirs()]:
        if d is not None and d.is_dir():
            known |= {p.stem for p in d.glob("*.json")}
    if store is not None:
        known |= {r.device_key for r in store.runs()}
        known |= {r.device_key for r in store.best()}
    if key not in known:
        raise ValueError(f"device: unknown device key {key!r}; known: {', '.join(sorted(known))}")
    return key
