"""Database URLs and engines: one path-to-URL rule, connect timeouts, SQLite's pragmas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url

#: seconds a server gets to answer a connection (an unreachable or silent PostgreSQL
#: listener must not hang a serving process's first resolve)
CONNECT_TIMEOUT_S = 5


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL (percent-decoded as SQLAlchemy opens it), else None
    (an in-memory database or another backend).

    >>> sqlite_path("sqlite:////tmp/a%20b.sqlite")
    PosixPath('/tmp/a b.sqlite')
    >>> sqlite_path("postgresql+psycopg://u@h/db") is None
    True
    """
    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - not a URL at all: the engine will say so
        return None
    if not u.drivername.startswith("sqlite"):
        return None
    if not u.database or u.database == ":memory:" or u.database.startswith("file:"):
        return None
    return Path(u.database)


def make_engine(url: str) -> Engine:
    """An engine for ``url``: SQLite with WAL, a busy timeout and NORMAL sync; a server
    with a connect timeout and pre-ping."""
    u = make_url(url)
    if u.drivername.startswith("sqlite"):
        engine = create_engine(u, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    connect_args: dict[str, Any] = {}
    if u.drivername.startswith(("postgresql", "mysql")):
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    return create_engine(u, pool_pre_ping=True, connect_args=connect_args)


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file, or None when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
