"""Lookup order, provenance, strict mode, overrides and degraded sources (fake op)."""

import json
import warnings

import pytest
import torch

import kdispatch
from kdispatch import KDispatchWarning, StrictMissError, dispatcher, registry
from kdispatch.device import Device
from kdispatch.store import MeasurementIn, Store
from kdispatch.tables import TABLE_FORMAT_VERSION, TableEntry, TableFile, Toolchain, write_table
from kdispatch.store import toolchain_versions

import fake_op

H200 = dict(device="nvidia-h200", n=1000, dtype="float16")


@pytest.fixture(autouse=True)
def _fake(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_DB", str(tmp_path / "kdispatch.sqlite"))
    dispatcher.reset()
    registry.register(fake_op.SPEC, replace=True)
    Store(str(tmp_path / "kdispatch.sqlite")).dispose()  # an empty user database
    yield
    registry.unregister(fake_op.SPEC.name)


def _key(**kw):
    dev = Device.from_key(kw.pop("device", "nvidia-h200"))
    return fake_op.SPEC.key(dev, {**H200, **kw}).model_dump(mode="json")


def _put_db(path, config, median=1.0, source_hash="fake0001", verified=True, status="ok"):
    store = Store(str(path))
    store.record(MeasurementIn(op="fake_scale", key=_key(), config=config,
                               source_hash=source_hash, status=status, verified=verified,
                               median_us=median))
    store.dispose()


def _put_table(dirpath, config, device="nvidia-h200", source_hash="fake0001", key=None):
    table = TableFile(format_version=TABLE_FORMAT_VERSION, device=Device.from_key(device),
                      toolchain=Toolchain(**toolchain_versions()), created="2026-11-29",
                      entries=[TableEntry(op="fake_scale", key=key or _key(device=device),
                                          config=config, source_hash=source_hash,
                                          median_us=2.0)])
    write_table(table, dirpath / f"{device}.json")


def _fresh():
    return dispatcher.reset()


def test_heuristic_then_memo():
    e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "heuristic" and e.config.block == 64
    assert [c.source for c in e.consulted] == ["memo", "database", "table", "heuristic"]
    e2 = kdispatch.explain("fake_scale", **H200)
    assert e2.provenance == "memo" and e2.origin == "heuristic" and e2.config == e.config
    s = kdispatch.stats()
    assert s.resolutions == 2 and s.memo_hits == 1 and s.by_source == {"heuristic": 2}
    assert len(s.misses) == 1 and list(s.misses.values()) == [2]


def test_database_beats_table_beats_heuristic(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path / "tables"))
    (tmp_path / "tables").mkdir()
    _put_table(tmp_path / "tables", {"block": 16, "num_warps": 2})
    _fresh()
    e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "table" and e.config.block == 16

    _put_db(tmp_path / "kdispatch.sqlite", {"block": 256, "num_warps": 8})
    _fresh()
    e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "database" and e.config.block == 256 and e.config.num_warps == 8
    assert kdispatch.stats().misses == {}


def test_database_snapshot_read_once(tmp_path):
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 256, "num_warps": 8})
    _fresh()
    assert kdispatch.resolve("fake_scale", **H200).block == 256
    # a tuner writing a faster row later never changes a config under this process
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 16, "num_warps": 2}, median=0.5)
    assert kdispatch.resolve("fake_scale", **dict(H200, n=999)).block == 256
    assert _fresh().resolve("fake_scale", dict(H200)).block == 16


def test_unverified_and_rejected_rows_are_never_used(tmp_path):
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 256, "num_warps": 8}, verified=False)
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 16, "num_warps": 8}, status="rejected",
            median=0.1)
    _fresh()
    assert kdispatch.explain("fake_scale", **H200).provenance == "heuristic"


def test_stale_database_row_warns_once_and_falls_back(tmp_path):
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 256, "num_warps": 8}, source_hash="old")
    _fresh()
    with pytest.warns(KDispatchWarning, match="other kernel sources"):
        e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "heuristic"


def test_stale_table_entry_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    _put_table(tmp_path, {"block": 16, "num_warps": 2}, source_hash="old")
    _fresh()
    with pytest.warns(KDispatchWarning, match="stale|other kernel sources"):
        e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "heuristic"


def test_strict_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("KDISPATCH_STRICT", "1")
    _fresh()
    with pytest.raises(StrictMissError, match="fake_scale"):
        kdispatch.resolve("fake_scale", **H200)
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 256, "num_warps": 8})
    _fresh()
    assert kdispatch.resolve("fake_scale", **H200).block == 256


def test_override_argument_and_env(monkeypatch):
    e = kdispatch.explain("fake_scale", config={"block": 16, "num_warps": 1}, **H200)
    assert e.provenance == "override" and e.config.block == 16
    with pytest.raises(ValueError, match="config: invalid fake_scale config"):
        kdispatch.resolve("fake_scale", config={"block": 3}, **H200)
    monkeypatch.setenv("KDISPATCH_OVERRIDE", json.dumps({"fake_scale": {"num_warps": 16}}))
    monkeypatch.setenv("KDISPATCH_STRICT", "1")  # an override wins over strict
    _fresh()
    e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "override" and e.config.num_warps == 16 and e.config.block == 64
    assert any(c.source == "override" for c in e.consulted)


def test_bad_override_env_warns_and_is_ignored(monkeypatch):
    monkeypatch.setenv("KDISPATCH_OVERRIDE", json.dumps({"fake_scale": {"num_warps": 1024}}))
    _fresh()
    with pytest.warns(KDispatchWarning, match="num_warps"):
        e = kdispatch.explain("fake_scale", **H200)
    assert e.provenance == "heuristic" and e.config.num_warps == 4
    monkeypatch.setenv("KDISPATCH_OVERRIDE", "{not json")
    with pytest.warns(KDispatchWarning, match="KDISPATCH_OVERRIDE ignored"):
        _fresh()


@pytest.mark.parametrize("garbage", [b"", b"this is not a database" * 100,
                                     b"SQLite format 3\x00" + b"\xff" * 5000])
def test_corrupt_database_warns_once_and_uses_heuristic(tmp_path, garbage):
    (tmp_path / "kdispatch.sqlite").write_bytes(garbage)
    _fresh()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e1 = kdispatch.explain("fake_scale", **H200)
        e2 = kdispatch.explain("fake_scale", **dict(H200, n=5))
    assert e1.provenance == "heuristic" and e2.provenance == "heuristic"
    if garbage:  # an empty file is a valid (empty) SQLite database
        msgs = [str(w.message) for w in caught if issubclass(w.category, KDispatchWarning)]
        assert len(msgs) == 1 and "database unusable" in msgs[0]
        assert "database unusable" in kdispatch.stats().db_error


def test_missing_explicit_database_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_DB", str(tmp_path / "nope" / "x.sqlite"))
    _fresh()
    with pytest.warns(KDispatchWarning, match="does not exist"):
        assert kdispatch.explain("fake_scale", **H200).provenance == "heuristic"
    assert not (tmp_path / "nope").exists()  # resolve never creates a database


@pytest.mark.parametrize("content", ["{", "[]", '{"format_version": 99}',
                                     '{"format_version": 1, "device": {}}'])
def test_corrupt_table_warns_once(tmp_path, monkeypatch, content):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    (tmp_path / "nvidia-h200.json").write_text(content)
    _fresh()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = kdispatch.explain("fake_scale", **H200)
        kdispatch.explain("fake_scale", **dict(H200, n=3))
    assert e.provenance == "heuristic"
    msgs = [w for w in caught if issubclass(w.category, KDispatchWarning)]
    assert len(msgs) == 1 and "table unusable" in str(msgs[0].message)


def test_table_for_another_device_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    _put_table(tmp_path, {"block": 16, "num_warps": 2}, device="nvidia-h100")
    (tmp_path / "nvidia-h100.json").rename(tmp_path / "nvidia-h200.json")
    _fresh()
    with pytest.warns(KDispatchWarning, match="for device 'nvidia-h100'"):
        assert kdispatch.explain("fake_scale", **H200).provenance == "heuristic"


def test_hostile_table_values_are_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    _put_table(tmp_path, {"block": 16, "num_warps": 1024})
    _fresh()
    with pytest.warns(KDispatchWarning, match="rejected 1 invalid"):
        assert kdispatch.explain("fake_scale", **H200).provenance == "heuristic"


def test_devices_do_not_share_rows(tmp_path):
    _put_db(tmp_path / "kdispatch.sqlite", {"block": 256, "num_warps": 8})
    _fresh()
    assert kdispatch.explain("fake_scale", **H200).provenance == "database"
    other = dict(H200, device="nvidia-h100")  # same arch and SM count, other part
    assert kdispatch.explain("fake_scale", **other).provenance == "heuristic"


def test_tensor_form_uses_shapes_only():
    x = torch.randn(100)
    e = kdispatch.explain("fake_scale", x=x)
    assert e.key.device == "cpu-interpreter" and e.key.n == 128
    assert kdispatch.explain("fake_scale", x=torch.randn(120)).provenance == "heuristic"
    assert kdispatch.explain("fake_scale", x=torch.randn(100)).provenance == "memo"


def test_unknown_op_names_known_ops():
    with pytest.raises(ValueError, match="op: unknown op 'nope'.*decode_attention"):
        kdispatch.resolve("nope", device="nvidia-h200")


def test_record_misses_writes_each_new_key_once(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_RECORD_MISSES", "1")
    d = _fresh()
    for n in (1000, 1000, 999, 5000):
        kdispatch.resolve("fake_scale", **dict(H200, n=n))
    d.flush_misses()
    store = Store(str(tmp_path / "kdispatch.sqlite"))
    misses = store.misses()
    assert sorted(k["n"] for op, k in misses) == [1024, 8192]
