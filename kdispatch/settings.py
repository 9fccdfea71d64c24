"""Environment settings, read once per dispatcher (never per resolve)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

DB_ENV = "KDISPATCH_DB"
STRICT_ENV = "KDISPATCH_STRICT"
OVERRIDE_ENV = "KDISPATCH_OVERRIDE"
RECORD_MISSES_ENV = "KDISPATCH_RECORD_MISSES"
TABLE_DIR_ENV = "KDISPATCH_TABLE_DIR"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/kdispatch`` (``~/.cache/kdispatch`` when unset): the default home of
    the database and the native launch cache's builds."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kdispatch"


def default_db_path() -> Path:
    """``$XDG_CACHE_HOME/kdispatch/kdispatch.sqlite`` (``~/.cache`` when unset)."""
    return cache_dir() / "kdispatch.sqlite"


def url_for_path(path: str | Path) -> str:
    """The SQLite URL of a file path, percent-encoded so that SQLAlchemy (which decodes the
    database part) opens exactly that file. The one path-to-URL rule of kdispatch.

    >>> url_for_path("/tmp/a%20b.sqlite")
    'sqlite:////tmp/a%2520b.sqlite'
    """
    return "sqlite:///" + quote(str(Path(path).expanduser().absolute()), safe="/")


def db_url(value: str | None = None) -> str:
    """A SQLAlchemy URL from ``value``, ``KDISPATCH_DB`` or the default SQLite file.

    A value without ``://`` is a file path for SQLite.

    >>> db_url("postgresql+psycopg://u@localhost/kd")
    'postgresql+psycopg://u@localhost/kd'
    >>> db_url("/tmp/x.sqlite")
    'sqlite:////tmp/x.sqlite'
    """
    raw = value if value is not None else os.environ.get(DB_ENV, "").strip()
    if not raw:
        return url_for_path(default_db_path())
    if "://" in raw:
        return raw
    return url_for_path(raw)


@dataclass(frozen=True)
class Settings:
    db_url: str
    db_explicit: bool
    strict: bool
    record_misses: bool
    table_dir: Path | None
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    override_error: str | None = None

    @classmethod
    def from_env(cls) -> Settings:
        overrides: dict[str, dict[str, Any]] = {}
        error = None
        raw = os.environ.get(OVERRIDE_ENV, "").strip()
        if raw:
            try:
                parsed = json.loads(raw)
                if not isinstance(parsed, dict) or not all(
                        isinstance(v, dict) for v in parsed.values()):
                    raise ValueError("expected an object of op name -> object of config fields")
                overrides = parsed
            except ValueError as exc:
                error = f"{OVERRIDE_ENV} ignored: {exc}"
        table_dir = os.environ.get(TABLE_DIR_ENV, "").strip()
        return cls(
            db_url=db_url(),
            db_explicit=bool(os.environ.get(DB_ENV, "").strip()),
            strict=_truthy(os.environ.get(STRICT_ENV)),
            record_misses=_truthy(os.environ.get(RECORD_MISSES_ENV)),
            table_dir=Path(table_dir) if table_dir else None,
            overrides=overrides,
            override_error=error,
        )
