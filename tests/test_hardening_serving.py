"""Hostile inputs to the serving path: a baseline never served, device keys that are paths,
nested tables, silent servers, database URLs with escapes, mixed dtypes, typos.

Each test is one finding of the hardening review; each failed on the code before it.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import torch

import kdispatch
from kdispatch import KDispatchWarning, dispatcher
from kdispatch.device import Device
from kdispatch.store import MeasurementIn, Store
from kdispatch.tables import (TABLE_FORMAT_VERSION, TableEntry, TableFile, Toolchain,
                              import_table, write_table)
from kdispatch.store import toolchain_versions

KV = dict(device="nvidia-h200", tokens=1, num_kv_heads=8, head_dim=128, page_size=16,
          dtype="bfloat16")
INDEXED = {"variant": "indexed", "block_h": 1, "block_t": 1, "num_warps": 4, "pdl": False}


def _kv_key(**kw):
    op = kdispatch.get_op("kv_write")
    return op.key(Device.from_key("nvidia-h200"), {**KV, **kw}).model_dump(mode="json")


def _table(entries, device="nvidia-h200"):
    return TableFile(format_version=TABLE_FORMAT_VERSION, device=Device.from_key(device),
                     toolchain=Toolchain(**toolchain_versions()), created="2026-11-30",
                     entries=[TableEntry(**e) for e in entries])


def _indexed_entry(us=0.5):
    return dict(op="kv_write", key=_kv_key(), config=INDEXED,
                source_hash=kdispatch.get_op("kv_write").source_hash(), median_us=us)


# -- 2: the indexed baseline is never served -------------------------------------------------
def test_indexed_baseline_from_a_table_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    write_table(_table([_indexed_entry()]), tmp_path / "nvidia-h200.json")
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="rejected 1 invalid kv_write"):
        cfg = kdispatch.resolve("kv_write", **KV)
    assert cfg.variant == "fused"


def test_indexed_baseline_from_a_database_row_is_refused(tmp_path, monkeypatch):
    db = tmp_path / "db.sqlite"
    Store(str(db)).record(MeasurementIn(
        op="kv_write", key=_kv_key(), config=INDEXED,
        source_hash=kdispatch.get_op("kv_write").source_hash(), status="ok", verified=True,
        median_us=0.1))
    monkeypatch.setenv("KDISPATCH_DB", str(db))
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="rejected an invalid kv_write config"):
        e = kdispatch.explain("kv_write", **KV)
    assert e.config.variant == "fused" and e.provenance != "database"


def test_indexed_baseline_is_refused_by_import(tmp_path):
    write_table(_table([_indexed_entry()]), tmp_path / "t.json")
    inserted, refused = import_table(tmp_path / "t.json", Store(str(tmp_path / "db.sqlite")))
    assert inserted == 0 and len(refused) == 1 and "baseline" in refused[0]


def test_indexed_baseline_from_the_override_env_is_ignored(monkeypatch):
    monkeypatch.setenv("KDISPATCH_OVERRIDE", json.dumps({"kv_write": {"variant": "indexed",
                                                                   "pdl": False}}))
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="baseline"):
        cfg = kdispatch.resolve("kv_write", **KV)
    assert cfg.variant == "fused"
    # an explicit config= still launches it (what the benchmarks compare with)
    assert kdispatch.resolve("kv_write", **KV, config=INDEXED).variant == "indexed"


# -- 3: device keys and tables ---------------------------------------------------------------
@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "nvidia-h200/../../x", "NVIDIA", ""])
def test_a_device_key_is_validated_before_any_path_is_built(bad):
    with pytest.raises(ValueError, match="device"):
        kdispatch.resolve("kv_write", **{**KV, "device": bad})


def test_a_deeply_nested_table_degrades_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    (tmp_path / "nvidia-h200.json").write_text("[" * 100000 + "]" * 100000)
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="nested"):
        e = kdispatch.explain("kv_write", **KV)
    assert e.provenance in ("table", "heuristic")  # kdispatch's own table may still serve
    nested = {"format_version": 1, "device": Device.from_key("nvidia-h200").model_dump(),
              "toolchain": toolchain_versions(), "created": "x",
              "entries": [{"op": "kv_write", "key": {"a": [[[[[[[[1]]]]]]]]}, "config": {},
                           "source_hash": "x"}]}
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(nested))
    dispatcher.reset()
    with pytest.warns(KDispatchWarning, match="nested deeper"):
        kdispatch.explain("kv_write", **KV)


# -- 4: a silent server, an escaped path -----------------------------------------------------
@pytest.fixture
def silent_listener():
    """A TCP port that accepts connections and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield sock.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    sock.close()


def test_a_silent_postgresql_server_degrades_the_first_resolve_quickly(silent_listener,
                                                                       monkeypatch):
    pytest.importorskip("psycopg")
    monkeypatch.setenv("KDISPATCH_DB", f"postgresql+psycopg://u:p@127.0.0.1:{silent_listener}/d")
    dispatcher.reset()
    t0 = time.monotonic()
    with pytest.warns(KDispatchWarning, match="database unusable"):
        e = kdispatch.explain("kv_write", **KV)
    assert time.monotonic() - t0 < 20  # a connect timeout, not the OS's ~2 minutes
    assert e.provenance in ("table", "heuristic")


def test_the_tuner_and_the_server_open_the_same_file_for_an_escaped_path(tmp_path,
                                                                         monkeypatch):
    weird = tmp_path / "a%20b c.sqlite"
    monkeypatch.setenv("KDISPATCH_DB", str(weird))
    store = Store()  # what the tuner opens from KDISPATCH_DB
    assert store.path == weird and weird.exists()
    store.record(MeasurementIn(op="kv_write", key=_kv_key(tokens=2),
                               config=kdispatch.resolve("kv_write", **{**KV, "tokens": 2})
                               .model_dump(mode="json"),
                               source_hash=kdispatch.get_op("kv_write").source_hash(),
                               status="ok", verified=True, median_us=1.0))
    dispatcher.reset()
    assert kdispatch.explain("kv_write", **{**KV, "tokens": 2}).provenance == "database"
    assert not (tmp_path / "a b c.sqlite").exists()


# -- 9, 11: typos and mixed dtypes -----------------------------------------------------------
def test_an_unknown_plain_argument_is_refused_by_name():
    with pytest.raises(ValueError, match="bogus: unknown argument"):
        kdispatch.resolve("kv_write", **KV, bogus=1)
    with pytest.raises(ValueError, match="num_kv_heads: required"):
        kdispatch.resolve("kv_write", device="nvidia-h200", tokens=1, head_dim=128)


def test_the_tensor_form_refuses_unknown_names_even_after_a_memo_hit(dev):
    """The memo hit reads only what the key needs; a call whose names the key would refuse
    (an unknown name, a missing tensor) never hits, and the call's own keyword arguments
    resolve like the five tensors."""
    q = torch.randn(2, 4, 32, device=dev)
    kc = torch.randn(4, 16, 1, 32, device=dev)
    bt = torch.zeros(2, 2, dtype=torch.int32, device=dev)
    sl = torch.ones(2, dtype=torch.int32, device=dev)
    five = dict(q=q, k_cache=kc, v_cache=kc, block_table=bt, seq_lens=sl)
    cfg = kdispatch.resolve("decode_attention", **five)
    assert kdispatch.explain("decode_attention", **five).provenance == "memo"
    with pytest.raises(ValueError,
                       match="^bogus: unknown argument of decode_attention's tensor form"):
        kdispatch.resolve("decode_attention", **five, bogus=1)
    with pytest.raises(ValueError, match="^bogus: unknown argument"):  # a device named too
        kdispatch.resolve("decode_attention", **five, device="nvidia-h200", bogus=1)
    with pytest.raises(ValueError, match="^seq_lens: expected a torch.Tensor"):
        # five names again, but not the five: a window in place of seq_lens
        kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=kc, block_table=bt,
                          sliding_window=8)
    assert kdispatch.resolve("decode_attention", **five, scale=0.1, logit_cap=0.0) == cfg
    windowed = kdispatch.explain("decode_attention", **five, sliding_window=16)
    assert windowed.key.sliding and windowed.key.context == 16


def test_the_plain_form_with_a_device_object_still_resolves():
    """What the vLLM plugin passes: ``device=`` a Device object and plain arguments."""
    d = kdispatch.Device.from_key("nvidia-h200")
    plain = dict(batch=4, context=4096, num_q_heads=32, num_kv_heads=8, head_dim=128,
                 page_size=16, dtype="bfloat16")
    assert kdispatch.resolve("decode_attention", device=d, **plain) == kdispatch.resolve(
        "decode_attention", device="nvidia-h200", **plain)
    with pytest.raises(ValueError, match="bogus"):
        kdispatch.resolve("decode_attention", device=d, **plain, bogus=1)


def test_the_writer_tensor_form_refuses_unknown_names_after_a_hit(dev):
    key = torch.randn(3, 2, 32, device=dev)
    kc = torch.randn(4, 16, 2, 32, device=dev)
    call = dict(key=key, value=key, key_cache=kc, value_cache=kc,
                slot_mapping=torch.arange(3, device=dev))
    kdispatch.resolve("kv_write", **call)
    assert kdispatch.explain("kv_write", **call).provenance == "memo"
    with pytest.raises(ValueError, match="^row_msak: unknown argument of kv_write's tensor form"):
        kdispatch.resolve("kv_write", **call, row_msak=None)


def test_an_override_for_an_unknown_op_is_named(monkeypatch):
    monkeypatch.setenv("KDISPATCH_OVERRIDE", json.dumps({"kv_wirte": {"block_h": 2}}))
    with pytest.warns(KDispatchWarning, match="unknown ops kv_wirte"):
        dispatcher.reset()


def test_q_in_another_dtype_than_the_cache_names_the_argument(dev):
    q = torch.randn(1, 4, 32, device=dev)
    kc = torch.randn(2, 16, 1, 32, device=dev, dtype=torch.bfloat16)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=dev)
    sl = torch.ones(1, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="^k_cache: dtype bfloat16 differs from q's float32"):
        kdispatch.decode_attention(q, kc, kc, bt, sl, scale=0.1)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_scale_is_refused_on_the_first_call(dev, scale):
    q = torch.randn(1, 4, 32, device=dev)
    kc = torch.randn(2, 16, 1, 32, device=dev)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=dev)
    sl = torch.ones(1, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="^scale: must be a finite float"):
        kdispatch.decode_attention(q, kc, kc, bt, sl, scale=scale)
