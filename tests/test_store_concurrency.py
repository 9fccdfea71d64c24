"""Eight processes writing one database at once (SQLite with its file lock, and PostgreSQL)."""

import multiprocessing as mp
import random

from kdispatch.store import MeasurementIn, Store, digest

PROCS, PER_PROC, KEYS = 8, 30, 5


def _key(i: int) -> dict:
    return {"device": "nvidia-h200", "vendor": "nvidia", "arch": "sm_90", "cu_count": 132,
            "dtype": "bfloat16", "num_kv_heads": 8, "head_dim": 128, "page_size": 16,
            "tokens": 1 << i}


def _worker(url: str, worker: int, barrier) -> None:
    rng = random.Random(worker)
    store = Store(url)
    barrier.wait()  # start writing together
    for i in range(PER_PROC):
        ok = store.record(MeasurementIn(
            op="kv_write", key=_key(i % KEYS), config={"worker": worker, "i": i},
            source_hash="h", status="ok", verified=True, median_us=rng.uniform(1, 100)))
        assert ok
        store.record_miss("kv_write", _key(i % KEYS))


def test_eight_writers_lose_nothing(db_url):
    Store(db_url).dispose()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCS)
    procs = [ctx.Process(target=_worker, args=(db_url, w, barrier)) for w in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * PROCS  # no "database is locked" escaped

    store = Store(db_url)
    rows = store.measurements(op="kv_write")
    assert len(rows) == PROCS * PER_PROC
    assert {r.config_digest for r in rows} == {
        digest({"worker": w, "i": i}) for w in range(PROCS) for i in range(PER_PROC)}
    # best per key: one consistent answer, equal to the minimum over every committed row
    best = store.best(op="kv_write")
    assert len(best) == KEYS
    for b in best:
        mine = [r for r in rows if r.key_digest == b.key_digest]
        fastest = min(mine, key=lambda r: (r.median_us, r.id))
        assert b.median_us == fastest.median_us and digest(b.config) == fastest.config_digest
    assert store.best(op="kv_write") == best
    assert len(store.misses()) == KEYS
