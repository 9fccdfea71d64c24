"""kv_write dispatch spec: key, config, validity, heuristic, candidates, memo key (no kernels)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

import kdispatch
from kdispatch.device import Device
from kdispatch.kernels.kv_write import KVWriteConfig, KVWriteKey
from kdispatch.kernels.kv_write import OP as SPEC
from kdispatch.opdef import OpKey
from kdispatch.registry import get_op

H200 = Device.from_key("nvidia-h200")
PLAIN = dict(device="nvidia-h200", tokens=8, num_kv_heads=16, head_dim=128, page_size=16,
             dtype="bfloat16", masking="none")
MASKINGS = ("none", "row_mask", "active_rows", "both")


def mkkey(**kw) -> KVWriteKey:
    fields = dict(dtype="bfloat16", num_kv_heads=16, head_dim=128, page_size=16, tokens=8,
                  masking="none")
    fields.update(kw)
    return KVWriteKey(**OpKey.device_fields(H200), **fields)


def tensor_args(device="meta", tokens=8, heads=16, dim=128, page=16, dtype=torch.bfloat16,
                row_mask=False, active_rows=False) -> dict:
    """Tensor-form args on the meta device: any value read would raise."""
    qkv = torch.empty(tokens, 3 * heads * dim, dtype=dtype, device=device)
    return {
        "key": qkv[:, heads * dim:2 * heads * dim].view(tokens, heads, dim),
        "value": qkv[:, 2 * heads * dim:].view(tokens, heads, dim),
        "key_cache": torch.empty(4, page, heads, dim, dtype=dtype, device=device),
        "value_cache": torch.empty(4, page, heads, dim, dtype=dtype, device=device),
        "slot_mapping": torch.empty(tokens, dtype=torch.int64, device=device),
        "row_mask": torch.empty(tokens, dtype=torch.bool, device=device) if row_mask else None,
        "active_rows": torch.empty(1, dtype=torch.int32, device=device) if active_rows else None,
    }


def test_registered_under_kv_write():
    assert get_op("kv_write") is SPEC
    assert len(SPEC.kernels) == 1
    assert len(SPEC.source_hash()) == 16


# -- keys ---------------------------------------------------------------------------------
def test_plain_and_tensor_forms_give_the_same_key():
    plain = SPEC.key(H200, PLAIN)
    tensor = SPEC.key(H200, tensor_args(tokens=7))  # bucket 8
    assert plain == tensor == mkkey()


@pytest.mark.parametrize("tokens,bucket", [(1, 1), (2, 2), (3, 4), (16, 16), (17, 32),
                                           (65536, 65536), (100000, 65536)])
def test_tokens_are_bucketed(tokens, bucket):
    assert SPEC.key(H200, {**PLAIN, "tokens": tokens}).tokens == bucket


@pytest.mark.parametrize("row_mask,active_rows,masking", [
    (False, False, "none"), (True, False, "row_mask"), (False, True, "active_rows"),
    (True, True, "both")])
def test_masking_comes_from_which_tensors_are_present(row_mask, active_rows, masking):
    args = tensor_args(row_mask=row_mask, active_rows=active_rows)
    assert SPEC.key(H200, args).masking == masking


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tensor_key_reads_dtype_and_page(dtype):
    key = SPEC.key(H200, tensor_args(dtype=dtype, page=32, heads=2, dim=576))
    assert (key.dtype, key.page_size, key.num_kv_heads, key.head_dim) == (
        str(dtype).split(".")[-1], 32, 2, 576)


@pytest.mark.parametrize("field,value", [
    ("num_kv_heads", 0), ("num_kv_heads", 1025), ("head_dim", 0), ("head_dim", 4096),
    ("page_size", 0), ("page_size", 1 << 20), ("tokens", 0), ("tokens", 12),
    ("tokens", 1 << 17), ("masking", "sometimes"), ("dtype", "int8"), ("dtype", "float64")])
def test_absurd_keys_fail(field, value):
    with pytest.raises(ValidationError):
        mkkey(**{field: value})


def test_key_rejects_extra_fields_and_is_frozen():
    with pytest.raises(ValidationError):
        mkkey(batch=3)
    key = mkkey()
    with pytest.raises(ValidationError):
        key.tokens = 16  # type: ignore[misc]


def test_key_json_round_trip():
    key = mkkey(masking="both", dtype="float16")
    assert SPEC.parse_key(key.model_dump(mode="json")) == key


def test_plain_form_errors_name_the_argument():
    args = {k: v for k, v in PLAIN.items() if k != "head_dim"}
    with pytest.raises(ValueError, match="^head_dim:"):
        SPEC.key(H200, args)
    with pytest.raises(ValueError, match="^tokens:"):
        SPEC.key(H200, {**PLAIN, "tokens": 0})
    with pytest.raises(ValueError, match="^dtype:"):
        SPEC.key(H200, {**PLAIN, "dtype": "int8"})


def test_tensor_form_errors_name_the_argument():
    args = tensor_args()
    with pytest.raises(ValueError, match="^key_cache:"):
        SPEC.key(H200, {**args, "key_cache": args["key_cache"][0]})
    with pytest.raises(ValueError, match="^key:"):
        SPEC.key(H200, {**args, "key": args["key"].flatten(1)})
    with pytest.raises(ValueError, match="^key:"):
        SPEC.key(H200, {**args, "key": args["key"].to(torch.int32)})
    bad = {**args, "key_cache": [1, 2]}
    SPEC.memo_key(bad)  # the hot path never raises an unrelated error...
    with pytest.raises(ValueError, match="^key_cache:"):
        SPEC.key(H200, bad)  # ...the key names the argument


def test_zero_tokens_maps_to_the_smallest_bucket():
    assert SPEC.key(H200, tensor_args(tokens=0)).tokens == 1


# -- memo key and device ----------------------------------------------------------------------
def test_memo_key_is_hashable_and_value_free():
    a = SPEC.memo_key(tensor_args())
    b = SPEC.memo_key(tensor_args())
    assert hash(a) == hash(b) and a == b  # different (meta) storage, same memo entry


def test_memo_key_distinguishes_what_the_key_reads():
    base = SPEC.memo_key(tensor_args())
    for kw in ({"tokens": 9}, {"heads": 8}, {"dim": 64}, {"page": 32},
               {"dtype": torch.float16}, {"row_mask": True}, {"active_rows": True}):
        assert SPEC.memo_key(tensor_args(**kw)) != base, kw
    p = SPEC.memo_key(PLAIN)
    assert p != SPEC.memo_key({**PLAIN, "masking": "both"})
    assert p != SPEC.memo_key({**PLAIN, "device": "nvidia-h100"})
    assert p == SPEC.memo_key(dict(PLAIN))


def test_memo_key_equal_means_key_equal():
    """Two args with one memo key must map to one key (the memo's soundness)."""
    args_a = tensor_args(tokens=5)
    args_b = {**tensor_args(tokens=5), "slot_mapping": torch.empty(5, dtype=torch.int32,
                                                                   device="meta")}
    assert SPEC.memo_key(args_a) == SPEC.memo_key(args_b)
    assert SPEC.key(H200, args_a) == SPEC.key(H200, args_b)


def test_device_of():
    assert SPEC.device_of(PLAIN) == "nvidia-h200"
    assert SPEC.device_of(tensor_args()) == torch.device("meta")
    assert SPEC.device_of(tensor_args(device="cpu")) == torch.device("cpu")


def test_resolve_plain_form_uses_the_shipped_table_then_the_heuristic():
    exp = kdispatch.explain("kv_write", **PLAIN)
    assert exp.provenance == "table"  # tuned on the H200, shipped in db/nvidia-h200.json
    assert kdispatch.resolve("kv_write", **PLAIN) == exp.config
    other = {**PLAIN, "device": "amd-mi355x"}  # no table for this GPU
    exp = kdispatch.explain("kv_write", **other)
    assert exp.provenance == "heuristic"
    assert exp.config == SPEC.heuristic(SPEC.key(kdispatch.Device.from_key("amd-mi355x"),
                                                 other))


def test_override_to_indexed_is_refused_for_masked_keys():
    with pytest.raises(ValueError, match="config"):
        kdispatch.resolve("kv_write", **{**PLAIN, "masking": "row_mask"},
                          config={"variant": "indexed"})
    cfg = kdispatch.resolve("kv_write", **PLAIN, config={"variant": "indexed"})
    assert cfg.variant == "indexed"


# -- configs ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"block_h": 3}, {"block_h": 0}, {"block_h": 128},
                                {"block_t": 6}, {"block_t": 128}, {"num_warps": 3},
                                {"variant": "scatter"}, {"split": 2}])
def test_bad_configs_fail(kw):
    with pytest.raises(ValidationError):
        KVWriteConfig(**kw)


def test_config_json_round_trip():
    cfg = KVWriteConfig(variant="fused", block_h=8, block_t=2, num_warps=2)
    assert SPEC.parse_config(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize("masking", MASKINGS)
def test_indexed_only_valid_unmasked(masking):
    key = mkkey(masking=masking)
    assert SPEC.is_valid(key, KVWriteConfig(variant="indexed")) == (masking == "none")
    if masking != "none":
        with pytest.raises(ValueError, match="^config:"):
            SPEC.check_config(key, KVWriteConfig(variant="indexed"))


def test_fused_pruning():
    key = mkkey(num_kv_heads=3, head_dim=128, tokens=4)
    assert SPEC.is_valid(key, KVWriteConfig(block_h=4, block_t=4, num_warps=4))
    assert not SPEC.is_valid(key, KVWriteConfig(block_h=8))  # more heads than padded 4
    assert not SPEC.is_valid(key, KVWriteConfig(block_t=8))  # more rows than the bucket
    big = mkkey(head_dim=1024, num_kv_heads=64, tokens=64)
    assert not SPEC.is_valid(big, KVWriteConfig(block_h=32, block_t=1, num_warps=8))  # tile
    assert not SPEC.is_valid(big, KVWriteConfig(block_h=8, block_t=1, num_warps=1))  # regs
    tiny = mkkey(head_dim=16, num_kv_heads=1, tokens=1)
    assert not SPEC.is_valid(tiny, KVWriteConfig(num_warps=8))  # idle warps


def test_baseline_is_indexed():
    assert SPEC.tuning.baseline(mkkey()).variant == "indexed"
    assert SPEC.is_valid(mkkey(), SPEC.tuning.baseline(mkkey()))


# -- heuristic ----------------------------------------------------------------------------
def _key_grid():
    for heads in (1, 3, 8, 16, 40, 128, 1024):
        for dim in (1, 16, 64, 96, 128, 256, 576, 1024):
            for tokens in (1, 8, 64, 4096, 65536):
                for masking in MASKINGS:
                    yield mkkey(num_kv_heads=heads, head_dim=dim, tokens=tokens, masking=masking,
                                page_size=16)


def test_heuristic_is_fused_and_always_valid():
    n = 0
    for key in _key_grid():
        cfg = SPEC.heuristic(key)
        assert cfg.variant == "fused", key
        assert SPEC.is_valid(key, cfg), (key, cfg)
        n += 1
    assert n > 1000


def test_heuristic_for_ouro_decode():
    # the H200 sweep's best configs (bench/results/nvidia-h200/kv_write.json)
    assert SPEC.heuristic(mkkey(tokens=1)) == KVWriteConfig(variant="fused", block_h=4,
                                                             block_t=1, num_warps=4, pdl=True)
    assert SPEC.heuristic(mkkey(tokens=64)) == KVWriteConfig(variant="fused", block_h=16,
                                                              block_t=1, num_warps=4, pdl=True)


@pytest.mark.parametrize("device,pdl", [("nvidia-h200", True), ("nvidia-h100", True),
                                        ("nvidia-rtx-5090", True), ("nvidia-a100", False),
                                        ("amd-mi300x", False), ("cpu-interpreter", False)])
def test_pdl_only_where_the_device_has_it(device, pdl):
    dev = Device.interpreter() if device == "cpu-interpreter" else Device.from_key(device)
    key = KVWriteKey(**OpKey.device_fields(dev), dtype="bfloat16", num_kv_heads=16,
                     head_dim=128, page_size=16, tokens=1)
    assert SPEC.heuristic(key).pdl is pdl
    with_pdl = SPEC.heuristic(key).model_copy(update={"pdl": True})
    assert SPEC.is_valid(key, with_pdl) is pdl
    cands = list(SPEC.tuning.candidates(key))
    assert all(SPEC.is_valid(key, c) for c in cands)
    if pdl:  # every tile with pdl, and the heuristic's tile without it (first)
        assert cands[0] == SPEC.heuristic(key).model_copy(update={"pdl": False})
        assert all(c.pdl for c in cands[1:])
    else:
        assert not any(c.pdl for c in cands)


def test_indexed_with_pdl_is_invalid():
    assert not SPEC.is_valid(mkkey(), KVWriteConfig(variant="indexed", pdl=True))


def test_heuristic_does_not_depend_on_masking():
    for masking in MASKINGS:
        assert SPEC.heuristic(mkkey(masking=masking)) == SPEC.heuristic(mkkey())


def test_heuristic_ladders_move():
    assert SPEC.heuristic(mkkey(head_dim=576, num_kv_heads=1)).block_h == 1
    assert SPEC.heuristic(mkkey(head_dim=1024, num_kv_heads=8)).block_h == 2
    assert SPEC.heuristic(mkkey(head_dim=1024, num_kv_heads=8, tokens=1)).block_h == 1
    assert SPEC.heuristic(mkkey(head_dim=64, num_kv_heads=64, tokens=128)).block_h == 32
    assert SPEC.heuristic(mkkey(head_dim=64, num_kv_heads=64, tokens=1)).block_h == 8
    assert SPEC.heuristic(mkkey(head_dim=8, num_kv_heads=1024, tokens=128)).block_h == 64
    assert SPEC.heuristic(mkkey(tokens=65536)).block_t == 1
    assert SPEC.heuristic(mkkey(head_dim=16, num_kv_heads=2)).num_warps == 1
    assert SPEC.heuristic(mkkey(head_dim=16, num_kv_heads=16)).num_warps == 2
    assert SPEC.heuristic(mkkey(head_dim=256, num_kv_heads=64, tokens=128)).num_warps == 4


def test_fp8_threads_may_hold_two_values_and_one_token_writes_take_two():
    """An fp8 cache's writer may run 2 values a thread (each value is a division), a bf16
    one no fewer than 4; the heuristic gives one-token fp8 writes 256-value programs at 2 a
    thread."""
    fp8 = mkkey(tokens=1, kv_dtype="float8_e4m3fn")
    bf16 = mkkey(tokens=1)
    eight = KVWriteConfig(block_h=4, num_warps=8)  # 512 values over 256 threads
    assert SPEC.is_valid(fp8, eight) and not SPEC.is_valid(bf16, eight)
    assert not SPEC.is_valid(fp8, KVWriteConfig(block_h=2, num_warps=8))  # 1 a thread
    assert eight.model_copy(update={"pdl": True}) in list(SPEC.tuning.candidates(fp8))
    def hw(**kw):
        c = SPEC.heuristic(mkkey(tokens=1, kv_dtype="float8_e4m3fn", **kw))
        return c.block_h, c.block_t, c.num_warps
    assert hw() == (2, 1, 4)  # 256 values over 128 threads (the tune's best, session 25)
    assert hw(head_dim=64, num_kv_heads=8) == (4, 1, 4)
    assert hw(head_dim=256, num_kv_heads=8) == (1, 1, 4)
    assert hw(head_dim=576, num_kv_heads=1) == (1, 1, 8)  # 1024 padded values: 4 a thread
    assert hw(head_dim=16, num_kv_heads=1) == (1, 1, 1)
    assert (SPEC.heuristic(bf16).block_h, SPEC.heuristic(bf16).num_warps) == (4, 4)
    assert all(SPEC.is_valid(mkkey(tokens=1, kv_dtype="float8_e4m3fn", **kw),
                             SPEC.heuristic(mkkey(tokens=1, kv_dtype="float8_e4m3fn", **kw)))
               for kw in ({}, {"head_dim": 576, "num_kv_heads": 1},
                          {"head_dim": 16, "num_kv_heads": 1}))
    assert SPEC.heuristic(mkkey(tokens=8, kv_dtype="float8_e4m3fn")).num_warps == 2


def test_a_decode_step_over_many_heads_takes_programs_of_several_rows():
    """2-64 tokens over more than 16 heads (the 55 x 96 preset's measured bests)."""
    def hw(**kw):
        c = SPEC.heuristic(mkkey(head_dim=96, num_kv_heads=55, **kw))
        return c.block_h, c.block_t, c.num_warps
    assert hw(tokens=8) == (2, 4, 4) and hw(tokens=64) == (2, 4, 4)
    assert hw(tokens=8, kv_dtype="float8_e4m3fn") == (1, 4, 4)
    assert hw(tokens=64, kv_dtype="float8_e4m3fn") == (1, 4, 1)  # session 25's best
    assert hw(tokens=2) == (4, 2, 4)
    assert hw(tokens=1)[1] == 1 and hw(tokens=128)[1] == 1  # one token, bulk: as before
    assert SPEC.heuristic(mkkey(num_kv_heads=16, tokens=8)).block_t == 1  # 16 heads: as before


# -- candidates ---------------------------------------------------------------------------
@pytest.mark.parametrize("masking", MASKINGS)
def test_candidates_never_include_indexed(masking):
    key = mkkey(masking=masking)
    cands = list(SPEC.tuning.candidates(key))
    assert cands and all(c.variant == "fused" for c in cands)
    assert all(SPEC.is_valid(key, c) for c in cands)
    assert len(set(cands)) == len(cands)
    assert SPEC.heuristic(key) in cands


def test_candidates_cover_the_grid():
    for key in _key_grid():
        cands = list(SPEC.tuning.candidates(key))
        assert cands, key
        assert SPEC.heuristic(key) in cands, key


# -- tuner hooks --------------------------------------------------------------------------
@pytest.mark.parametrize("masking", MASKINGS)
def test_make_inputs_shape_and_content(masking):
    key = mkkey(num_kv_heads=2, head_dim=32, page_size=4, tokens=16, masking=masking,
                dtype="float16")
    inputs = SPEC.tuning.make_inputs(key, "cpu", seed=1)
    assert SPEC.key(H200, inputs).model_dump(exclude={"device", "vendor", "arch", "cu_count"}) \
        == key.model_dump(exclude={"device", "vendor", "arch", "cu_count"})
    k, v = inputs["key"], inputs["value"]
    assert not k.is_contiguous() and k.stride(0) == 3 * 2 * 32  # views of one qkv
    assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    for name in ("key", "value", "key_cache", "value_cache"):
        assert (inputs[name] != 0).all(), name
    slots = inputs["slot_mapping"]
    num_slots = inputs["key_cache"].shape[0] * 4
    valid = slots[slots >= 0]
    assert len(valid.unique()) == len(valid) and int(valid.max()) < num_slots
    assert (slots < 0).any() == (masking != "none")
    assert (inputs["row_mask"] is not None) == (masking in ("row_mask", "both"))
    assert (inputs["active_rows"] is not None) == (masking in ("active_rows", "both"))
    if inputs["active_rows"] is not None:
        assert inputs["active_rows"].dtype == torch.int32 and inputs["active_rows"].numel() == 1


def test_make_inputs_is_seeded():
    key = mkkey(num_kv_heads=2, head_dim=32, page_size=4, tokens=16, masking="both")
    a, b, c = (SPEC.tuning.make_inputs(key, "cpu", seed=s) for s in (3, 3, 4))
    assert torch.equal(a["key"], b["key"]) and torch.equal(a["slot_mapping"], b["slot_mapping"])
    assert not torch.equal(a["key"], c["key"])


def test_make_inputs_first_and_last_slot():
    key = mkkey(num_kv_heads=1, head_dim=16, page_size=4, tokens=8)
    inputs = SPEC.tuning.make_inputs(key, "cpu", seed=0)
    slots = inputs["slot_mapping"]
    assert int(slots[0]) == 0 and int(slots[-1]) == inputs["key_cache"].shape[0] * 4 - 1


def test_tolerance_is_exact_and_bytes_moved():
    for dtype in ("float32", "float16", "bfloat16"):
        assert SPEC.tuning.tolerance(mkkey(dtype=dtype)) == (0.0, 0.0)
    t, h, d = 8, 16, 128
    assert SPEC.tuning.bytes_moved(mkkey()) == 4 * t * h * d * 2 + 8 * t
    assert SPEC.tuning.bytes_moved(mkkey(dtype="float32", masking="both")) == \
        4 * t * h * d * 4 + 8 * t + t + 4
