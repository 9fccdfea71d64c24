"""The tuning database: round trip, best-per-key, schema versions, concurrent writers."""

import json
import multiprocessing as mp
import os
import sqlite3

import pytest

from kdispatch import StoreError
from kdispatch.device import Device
from kdispatch.store import SCHEMA_VERSION, MeasurementIn, Store, digest

PG_URL = os.environ.get("KDISPATCH_TEST_PG_URL", "")  # what conftest's db_url fixture uses

KEY = {"device": "nvidia-h200", "vendor": "nvidia", "arch": "sm_90", "cu_count": 132,
       "dtype": "bfloat16", "num_q_heads": 12, "num_kv_heads": 1, "head_dim": 576,
       "head_dim_v": 512, "page_size": 16, "batch": 8, "context": 393216}


def _m(config, median, **kw):
    base = dict(op="decode_attention", key=KEY, config=config, source_hash="h1", status="ok",
                verified=True, median_us=median,
                p20_us=None if median is None else median * 0.9,
                p80_us=None if median is None else median * 1.1)
    base.update(kw)
    return MeasurementIn(**base)


def test_round_trip_keys_as_json_and_device_columns(db_url):
    store = Store(db_url)
    run = store.start_run(Device.from_key("nvidia-h200"), {"decode_attention": "h1"})
    assert store.record(_m({"num_kv_splits": 4}, 10.0), run_id=run)
    store.finish_run(run, "done")
    rows = store.measurements()
    assert len(rows) == 1
    r = rows[0]
    key = json.loads(r.key_json)
    assert (r.op, r.device_key, r.arch, r.cu_count, key["num_q_heads"], key["head_dim_v"],
            key["page_size"], key["batch"], key["context"]) \
        == ("decode_attention", "nvidia-h200", "sm_90", 132, 12, 512, 16, 8, 393216)
    assert r.key_digest == digest(KEY) and r.run_id == run and r.verified
    assert store.runs()[0].status == "done" and store.runs()[0].finished_at is not None
    assert store.counts() == {"runs": 1, "measurements": 1, "verified": 1, "misses": 0}


def test_duplicate_measurement_is_skipped(db_url):
    store = Store(db_url)
    assert store.record(_m({"num_kv_splits": 4}, 10.0))
    assert not store.record(_m({"num_kv_splits": 4}, 9.0))
    assert store.measured_configs("decode_attention", KEY, "h1") == {digest({"num_kv_splits": 4})}
    assert store.measured_configs("decode_attention", KEY, "h2") == set()


def test_best_verified_per_key(db_url):
    store = Store(db_url)
    store.record(_m({"s": 1}, 10.0))
    store.record(_m({"s": 2}, 5.0))
    store.record(_m({"s": 3}, 1.0, verified=False, status="rejected"))
    store.record(_m({"s": 4}, None, status="infeasible", verified=False, error="OutOfResources"))
    store.record(_m({"s": 5}, 5.0))  # a tie goes to the first committed
    other = dict(KEY, batch=32)
    store.record(_m({"s": 6}, 7.0, key=other))
    best = store.best(device_key="nvidia-h200")
    assert [(b.key["batch"], b.config) for b in best] == sorted(
        [(8, {"s": 2}), (32, {"s": 6})], key=lambda t: digest(dict(KEY, batch=t[0])))
    assert store.best(device_key="nvidia-h100") == []


def test_schema_version_and_newer_schema_refused(tmp_path):
    path = tmp_path / "db.sqlite"
    store = Store(str(path))
    assert store.schema_version() == SCHEMA_VERSION
    store.dispose()
    con = sqlite3.connect(path)
    con.execute("UPDATE kd_meta SET value='99' WHERE name='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer"):
        Store(str(path))
    with pytest.raises(StoreError, match="schema version 99"):
        Store(str(path), create=False)


def test_read_only_open_never_creates(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store(str(tmp_path / "absent.sqlite"), create=False)
    assert not (tmp_path / "absent.sqlite").exists()


def test_wal_mode(tmp_path):
    path = tmp_path / "db.sqlite"
    Store(str(path)).dispose()
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_bad_url_is_a_store_error():
    with pytest.raises(StoreError, match="cannot open database"):
        Store("nosuchdialect://x/y")


def _writer(path: str, worker: int, n: int) -> None:
    store = Store(path)
    for i in range(n):
        assert store.record(_m({"worker": worker, "i": i}, 1.0 + i))
        store.record_miss("decode_attention", dict(KEY, batch=1 + (i % 4)))


def test_two_processes_lose_no_rows(db_url):
    path = db_url
    Store(path).dispose()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 60)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    store = Store(path)
    rows = store.measurements()
    assert len(rows) == 120
    assert {(r.config_digest) for r in rows} == {
        digest({"worker": w, "i": i}) for w in range(2) for i in range(60)}
    assert len(store.misses()) == 4  # deduplicated across processes


def test_ci_runs_the_postgresql_tests():
    """CI must exercise PostgreSQL for real, not skip it."""
    assert PG_URL or not os.environ.get("CI"), \
        "CI=true but KDISPATCH_TEST_PG_URL is unset: .ci/postgres did not run"


def test_config_times_per_source_hash_and_config(db_url):
    store = Store(db_url)
    store.record(_m({"s": 1}, 9.0, is_heuristic=True))
    other = Store(db_url, toolchain={"kdispatch": "0", "torch": "other", "triton": "other"})
    assert other.record(_m({"s": 1}, 7.0))  # measured again by another toolchain: fastest
    store.record(_m({"s": 1}, 4.0, source_hash="h2"))
    store.record(_m({"s": 2}, 1.0))
    store.record(_m({"s": 3}, 0.5, status="rejected", verified=False))
    kd = digest(KEY)
    assert store.config_times("nvidia-h200") == {
        ("decode_attention", kd, "h1", digest({"s": 1})): 7.0,
        ("decode_attention", kd, "h2", digest({"s": 1})): 4.0,
        ("decode_attention", kd, "h1", digest({"s": 2})): 1.0}
    assert store.config_times("nvidia-h100") == {}
