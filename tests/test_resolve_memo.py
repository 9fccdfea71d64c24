"""The public resolve's memo hit (tensor form): it is taken, it is counted, and it never
returns the config of another key -- whatever the slow path keys on is in the memo key."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch import dispatcher
from kdispatch.device import Device
from kdispatch.dispatcher import Dispatcher
from kdispatch.kernels.decode_attention import OP

BF = torch.bfloat16
FP8 = torch.float8_e4m3fn


def decode_args(dev, *, batch=2, q_len=1, hq=8, hk=2, d=64, dv=None, page=16, pages=4,
                dtype=BF, kv_dtype=None, **extra):
    kv_dtype = kv_dtype or dtype
    shape = (batch, hq, d) if q_len == 1 else (batch, q_len, hq, d)
    k = torch.zeros(batch * pages, page, hk, d, device=dev).to(kv_dtype)
    v = k if dv is None else k[..., :dv]
    return dict(q=torch.zeros(shape, device=dev, dtype=dtype), k_cache=k, v_cache=v,
                block_table=torch.zeros(batch, pages, device=dev, dtype=torch.int32),
                seq_lens=torch.ones(batch, device=dev, dtype=torch.int32), **extra)


def write_args(dev, *, tokens=4, heads=2, d=64, page=16, dtype=BF, kv_dtype=None,
               row_mask=False):
    key = torch.zeros(tokens, heads, d, device=dev, dtype=dtype)
    cache = torch.zeros(8, page, heads, d, device=dev).to(kv_dtype or dtype)
    args = dict(key=key, value=key, key_cache=cache, value_cache=cache,
                slot_mapping=torch.zeros(tokens, device=dev, dtype=torch.long))
    if row_mask:
        args["row_mask"] = torch.ones(tokens, device=dev, dtype=torch.bool)
    return args


def fresh_config(op, args):
    """The config a dispatcher with an empty memo resolves for ``args``."""
    return Dispatcher().resolve(op, args)


@pytest.fixture(autouse=True)
def _fresh():
    dispatcher.reset()


def test_the_fast_path_is_taken_and_counted(dev, monkeypatch):
    args = decode_args(dev)
    cfg = kdispatch.resolve("decode_attention", **args)
    assert kdispatch.stats().memo_hits == 0

    def slow(*a, **kw):
        raise AssertionError("a memo hit reached the dispatcher's resolve")

    monkeypatch.setattr(Dispatcher, "resolve", slow)
    for _ in range(3):
        assert kdispatch.resolve("decode_attention", **decode_args(dev)) is cfg
    s = kdispatch.stats()
    assert (s.resolutions, s.memo_hits) == (4, 3)
    assert kdispatch.explain("decode_attention", **args).provenance == "memo"


#: (base, other): the same call but for one thing the key reads
DECODE_VARIANTS = {
    "dtype": ({}, dict(dtype=torch.float16)),
    "q dtype over one fp8 cache": (dict(kv_dtype=FP8), dict(kv_dtype=FP8, dtype=torch.float16)),
    "kv dtype (fp8 cache)": ({}, dict(kv_dtype=FP8)),
    "q_len": ({}, dict(q_len=2)),
    "block-table width": ({}, dict(pages=8)),
    "batch": ({}, dict(batch=4, pages=2)),  # one cache, one context, another batch bucket
    "q heads": ({}, dict(hq=16)),
    "kv heads": ({}, dict(hk=4)),
    "head dim": ({}, dict(d=128)),
    "v head dim": (dict(d=128), dict(d=128, dv=64)),
    "page size": ({}, dict(page=32)),
    "page size, one page table": (dict(page=16, pages=8), dict(page=32, pages=8, batch=2)),
    "sliding window": ({}, dict(sliding_window=16)),
    "batch_invariant": ({}, dict(batch_invariant=True)),
}


def _after_a_hit(op, base, other):
    """Resolve ``base`` twice (the second a hit: now the memo's last entry), then ``other``."""
    kdispatch.resolve(op, **base)
    kdispatch.resolve(op, **base)
    return kdispatch.resolve(op, **other)


@pytest.mark.parametrize("what", sorted(DECODE_VARIANTS))
def test_decode_hit_never_serves_another_key(dev, what):
    base_kw, other_kw = DECODE_VARIANTS[what]
    base, other = decode_args(dev, **base_kw), decode_args(dev, **other_kw)
    got = _after_a_hit("decode_attention", base, other)
    s = kdispatch.stats()
    assert (s.resolutions, s.memo_hits) == (3, 1), f"{what}: hit the other key's entry"
    assert kdispatch.explain("decode_attention", **other).key != \
        kdispatch.explain("decode_attention", **base).key
    assert got == fresh_config("decode_attention", other)
    assert kdispatch.resolve("decode_attention", **other) is got  # now a hit of its own


def test_decode_memo_key_determines_the_key(dev):
    """Over every variant above: one memo key, one key (the memo's soundness)."""
    seen: dict = {}
    for base_kw, other_kw in DECODE_VARIANTS.values():
        for kw in (base_kw, other_kw):
            args = decode_args(dev, **kw)
            key = OP.key(Device.from_torch(args["q"].device), args)
            assert seen.setdefault(OP.memo_key(args), key) == key, kw


def test_a_miss_still_checks_the_inputs(dev):
    """The memo key reads v_cache's page size and heads, which are k_cache's in every call
    the key accepts; a call whose caches disagree is refused (a miss runs the checks)."""
    args = decode_args(dev)
    with pytest.raises(ValueError, match="^v_cache:"):
        kdispatch.resolve("decode_attention",
                          **{**args, "k_cache": decode_args(dev, page=32)["k_cache"]})


WRITE_VARIANTS = {
    "dtype": ({}, dict(dtype=torch.float16)),
    "key dtype over one fp8 cache": (dict(kv_dtype=FP8), dict(kv_dtype=FP8,
                                                              dtype=torch.float16)),
    "kv dtype (fp8 cache)": ({}, dict(kv_dtype=FP8)),
    "tokens": ({}, dict(tokens=64)),
    "heads": ({}, dict(heads=8)),
    "head dim": ({}, dict(d=128)),
    "page size": ({}, dict(page=32)),
    "row mask": ({}, dict(row_mask=True)),
}


@pytest.mark.parametrize("what", sorted(WRITE_VARIANTS))
def test_write_hit_never_serves_another_key(dev, what):
    base_kw, other_kw = WRITE_VARIANTS[what]
    base, other = write_args(dev, **base_kw), write_args(dev, **other_kw)
    got = _after_a_hit("kv_write", base, other)
    assert kdispatch.stats().memo_hits == 1, f"{what}: hit the other key's entry"
    assert got == fresh_config("kv_write", other)


@pytest.mark.parametrize("op,make", [("decode_attention", decode_args),
                                     ("kv_write", write_args)])
def test_another_device_type_misses_and_is_refused(dev, op, make):
    """Same shapes and dtypes on the meta device: the memo key holds the device type (not
    only its index, -1 for both cpu and meta), so the slow path refuses the device."""
    kdispatch.resolve(op, **make(dev))
    kdispatch.resolve(op, **make(dev))  # a hit: now the memo's last entry
    with pytest.raises(ValueError, match="device"):
        kdispatch.resolve(op, **make("meta"))
    assert kdispatch.stats().memo_hits == 1


def test_explicit_config_bypasses_the_memo(dev):
    args = decode_args(dev)
    memo = kdispatch.resolve("decode_attention", **args)
    other = memo.model_copy(update={"num_warps": 2 if memo.num_warps != 2 else 4})
    assert kdispatch.resolve("decode_attention", config=other, **args) == other
    assert kdispatch.resolve("decode_attention", config=other.model_dump(), **args) == other
    with pytest.raises(ValueError, match="^config:"):
        kdispatch.resolve("decode_attention", config={"block_n": 48}, **args)
    assert kdispatch.stats().memo_hits == 0
    assert kdispatch.resolve("decode_attention", **args) is memo


def test_errors_still_name_the_argument_after_a_hit(dev):
    args = decode_args(dev)
    kdispatch.resolve("decode_attention", **args)
    with pytest.raises(ValueError, match="^sliding_window:"):
        kdispatch.resolve("decode_attention", **{**args, "sliding_window": 0})
    with pytest.raises(ValueError, match="sliding_window"):
        kdispatch.resolve("decode_attention", **{**args, "sliding_window": [4]})  # unhashable
    with pytest.raises(ValueError, match="^k_cache:"):
        kdispatch.resolve("decode_attention", **{**args, "k_cache": [1, 2]})
    with pytest.raises(ValueError, match="^block_table:"):
        kdispatch.resolve("decode_attention", **{**args, "block_table": None})
    assert kdispatch.stats().memo_hits == 0


def test_plain_and_tensor_forms_share_nothing_but_the_config():
    plain = dict(device="nvidia-h200", batch=8, context=32768, num_q_heads=32,
                 num_kv_heads=8, head_dim=128, page_size=16, dtype="bfloat16")
    a = kdispatch.resolve("decode_attention", **plain)
    assert kdispatch.resolve("decode_attention", **plain) is a
    assert kdispatch.resolve("decode_attention", **{**plain, "batch": 9}) is not a
    s = kdispatch.stats()
    assert (s.resolutions, s.memo_hits) == (3, 1)


def test_alternating_keys_each_get_their_own_entry(dev):
    """The last-entry check and the dict agree: two signatures called in turn (layers of
    two kinds) each get their own config and count their own hits."""
    a, b = decode_args(dev), decode_args(dev, sliding_window=16)
    ca, cb = (fresh_config("decode_attention", x) for x in (a, b))
    for _ in range(3):
        assert kdispatch.resolve("decode_attention", **a) == ca
        assert kdispatch.resolve("decode_attention", **b) == cb
    ea = kdispatch.explain("decode_attention", **a)
    eb = kdispatch.explain("decode_attention", **b)
    assert ea.key != eb.key and ea.provenance == eb.provenance == "memo"
    s = kdispatch.stats()
    assert (s.resolutions, s.memo_hits) == (8, 6)


def test_the_last_entry_is_the_memo_key_it_was_stored_under(dev):
    args = decode_args(dev)
    cfg = kdispatch.resolve("decode_attention", **args)
    kdispatch.resolve("decode_attention", **args)
    memo = dispatcher.HOT["decode_attention"]
    assert memo.last.config is cfg
    assert memo.last.memo_key == OP.memo_key(args)
    assert memo.entries[memo.last.memo_key] is memo.last


def test_only_the_global_dispatcher_feeds_the_public_memo_hit(dev):
    args = decode_args(dev)
    Dispatcher().resolve("decode_attention", args)  # a private dispatcher
    assert "decode_attention" not in dispatcher.HOT
    kdispatch.resolve("decode_attention", **args)
    assert dispatcher.HOT["decode_attention"] is \
        dispatcher.dispatcher()._memos["decode_attention"]
    dispatcher.reset()
    assert dispatcher.HOT == {}
    # a new dispatcher resolves afresh (its own memo), and is counted there
    kdispatch.resolve("decode_attention", **args)
    assert kdispatch.stats().resolutions == 1
