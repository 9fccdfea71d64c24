"""Plain records passed in and out of the store, and the canonical JSON of keys and configs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: nesting a stored key or config may have (they are flat objects of scalars)
MAX_JSON_DEPTH = 4


def canonical_json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def digest(data: Mapping[str, Any]) -> str:
    """Stable digest of a key or config dict (sha256 of canonical JSON, 32 hex)."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:32]


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, stopping once past ``limit``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        nxt = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = nxt
        depth += 1 if nxt else 0
    return depth


def json_object(text: str, what: str = "row") -> dict[str, Any]:
    """Parse a stored key or config: a JSON object no deeper than MAX_JSON_DEPTH.

    >>> json_object('{"a": 1}')
    {'a': 1}
    >>> json_object('[1]')
    Traceback (most recent call last):
    ...
    ValueError: row: expected a JSON object, got list
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{what}: not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(value).__name__}")
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ValueError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


@dataclass(frozen=True)
class BestRow:
    """The fastest verified measurement for one key."""

    op: str
    device_key: str
    key: dict[str, Any]
    key_digest: str
    config: dict[str, Any]
    median_us: float
    source_hash: str
    torch_version: str
    triton_version: str
    imported: bool = False


@dataclass(frozen=True)
class MeasurementIn:
    """What a tuner (or an import) records for one candidate."""

    op: str
    key: dict[str, Any]
    config: dict[str, Any]
    source_hash: str
    status: str
    verified: bool
    is_heuristic: bool = False
    is_baseline: bool = False
    imported: bool = False
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    max_error: float | None = None
    error: str | None = None
