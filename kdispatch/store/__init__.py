"""The tuning database: runs, measurements and recorded misses (SQLAlchemy 2.x).

SQLite by default (WAL mode, a busy timeout, and a file lock around every write so several
processes can share one file), or any SQLAlchemy URL, so a team can point every tuner and
server at one PostgreSQL database. Each measurement is committed on its own, so a killed
tuner loses at most the candidate in flight (and the row of its key's first timed
candidate, which waits for the key's end to be timed again).
"""

from kdispatch.settings import url_for_path
from kdispatch.store.engine import sqlite_path
from kdispatch.store.rows import BestRow, MeasurementIn, canonical_json, digest, json_object
from kdispatch.store.schema import SCHEMA_VERSION, Measurement, Miss, TuningRun
from kdispatch.store.host import toolchain_versions
from kdispatch.store.store import Store, read_best_snapshot

__all__ = ["SCHEMA_VERSION", "BestRow", "Measurement", "MeasurementIn", "Miss", "Store",
           "TuningRun", "canonical_json", "digest", "json_object", "read_best_snapshot",
           "sqlite_path", "toolchain_versions", "url_for_path"]
