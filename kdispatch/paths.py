"""Where shipped tables are looked for (no kdispatch imports: the device model reads here).

A table is ``<device-key>.json``. The directories, first match wins per entry:
``KDISPATCH_TABLE_DIR`` when set, an op's own ``table_dirs`` (a package shipping tables for
its ops), then kdispatch's own: the wheel's ``kdispatch/db`` and, in a source checkout,
the repository's ``db/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TABLE_DIR_ENV = "KDISPATCH_TABLE_DIR"
#: a device key: lowercase letters, digits and '-' (never a path)
DEVICE_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


def check_device_key(key: object, name: str = "device") -> str:
    """``key`` if it is a well-formed device key, else ValueError naming ``name``.

    >>> check_device_key("nvidia-h200")
    'nvidia-h200'
    >>> check_device_key("../x")
    Traceback (most recent call last):
    ...
    ValueError: device: '../x' is not a device key (lowercase letters, digits and '-', e.g. nvidia-h200)
    """
    if not isinstance(key, str) or not DEVICE_KEY_RE.match(key):
        raise ValueError(f"{name}: {key!r} is not a device key (lowercase letters, digits and "
                         "'-', e.g. nvidia-h200)")
    return key


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def env_table_dir() -> Path | None:
    raw = os.environ.get(TABLE_DIR_ENV, "").strip()
    return Path(raw) if raw else None


def builtin_table_dirs() -> list[Path]:
    """kdispatch's own table directories: the wheel's, then a source checkout's."""
    return [_package_dir() / "db", _package_dir().parent / "db"]


def table_dirs(extra: tuple[str | Path, ...] = ()) -> list[Path]:
    """The search path for one op: the env directory, ``extra`` (the op's), kdispatch's."""
    dirs: list[Path] = []
    env = env_table_dir()
    if env is not None:
        dirs.append(env)
    dirs.extend(Path(d) for d in extra)
    dirs.extend(builtin_table_dirs())
    seen: set[Path] = set()
    out = []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def table_file(directory: Path, device_key: str) -> Path | None:
    """``directory/<device_key>.json`` if it is a regular file (never a FIFO or device)."""
    check_device_key(device_key)
    p = directory / f"{device_key}.json"
    try:
        return p if p.is_file() else None
    except OSError:
        return None


def find_table_file(device_key: str, extra: tuple[str | Path, ...] = ()) -> Path | None:
    """The first ``<device_key>.json`` on the search path, or None."""
    for d in table_dirs(extra):
        p = table_file(d, device_key)
        if p is not None:
            return p
    return None
