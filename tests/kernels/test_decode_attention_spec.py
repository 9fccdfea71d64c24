"""decode_attention dispatch spec: keys, configs, heuristic, candidates (no kernels run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import kdispatch
from kdispatch.device import Device
from kdispatch.kernels.decode_attention import OP as SPEC
from kdispatch.kernels.decode_attention.spec import (
    MAX_CANDIDATES, WORKSPACE_BUDGET, DecodeConfig, DecodeKey,
)
from kdispatch.kernels.decode_attention import spec as spec_module
from kdispatch.kernels.decode_attention.spec import workspace_bytes as _workspace_bytes
from kdispatch.registry import get_op
from tool_modules import tool

RESULTS = Path(__file__).resolve().parents[2] / "bench/results/nvidia-h200"
H200 = Device.from_key("nvidia-h200")
KIMI = dict(batch=8, context=327600, num_q_heads=12, num_kv_heads=1, head_dim=576,
            head_dim_v=512, page_size=16, dtype="bfloat16")


def key(**kw):
    return SPEC.key(H200, {**KIMI, **kw})


def test_registry_returns_spec():
    assert get_op("decode_attention") is SPEC
    assert len(SPEC.kernels) == 4 and len(SPEC.source_hash()) == 16


def test_plain_key_buckets():
    k = key()
    assert (k.batch, k.context, k.kv_dtype, k.sliding, k.batch_invariant) == \
        (8, 393216, "bfloat16", False, False)
    assert key(batch=5).batch == 8
    assert key(sliding_window=4000).context == 4096 and key(sliding_window=4000).sliding
    inv = key(batch=64, batch_invariant=True)
    assert inv.batch == 1 and inv.batch_invariant


def test_tensor_key_reads_shapes_only(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the checks on a GPU host too
    q = torch.empty(3, 8, 64)
    k = torch.empty(10, 16, 2, 64)
    bt = torch.empty(3, 20, dtype=torch.int32)
    args = dict(q=q, k_cache=k, v_cache=k, block_table=bt,
                seq_lens=torch.full((3,), 2 ** 30, dtype=torch.int32))
    kk = SPEC.key(H200, args)
    assert (kk.batch, kk.context, kk.num_q_heads, kk.num_kv_heads, kk.head_dim) == \
        (4, 384, 8, 2, 64)
    other = {**args, "seq_lens": torch.ones(3, dtype=torch.int32)}
    assert SPEC.key(H200, other) == kk and SPEC.memo_key(other) == SPEC.memo_key(args)
    assert SPEC.memo_key({**args, "batch_invariant": True}) != SPEC.memo_key(args)


def test_key_validation():
    with pytest.raises(ValidationError):
        key(num_q_heads=12, num_kv_heads=5)
    with pytest.raises(ValidationError):
        DecodeKey(**{**key().model_dump(), "batch": 2, "batch_invariant": True})
    with pytest.raises(ValueError, match="sliding_window"):
        key(sliding_window=0)


@pytest.mark.parametrize("field,value", [("num_kv_splits", 0), ("num_kv_splits", 257),
                                         ("block_n", 48), ("block_n", 8), ("block_h", 8),
                                         ("num_warps", 3), ("num_stages", 0)])
def test_config_ranges(field, value):
    with pytest.raises(ValidationError):
        DecodeConfig(**{field: value})


def test_heuristic_fills_device_for_kimi():
    k = key()
    cfg = SPEC.heuristic(k)
    programs = k.batch * cfg.num_kv_splits
    assert programs >= k.cu_count and cfg.num_kv_splits > 1
    assert SPEC.is_valid(k, cfg)
    # the shipped H200 table's row at this key is the best of session 31's re-tune
    # (bench/results/nvidia-h200/session31/h200.sqlite, the first 8 candidates): the
    # heuristic's 16-row, 32-token tile, at its split count or twice it (session 18's tune
    # had 66 splits best, session 20's 33 merged in stage 1 at 888.8 us beside 66 at 895.0:
    # the first four within 4%)
    exp = kdispatch.explain("decode_attention", device="nvidia-h200", **KIMI)
    assert exp.origin == "table", exp
    got = exp.config
    assert got == _recorded_best(exp.key)
    assert got.num_kv_splits in (cfg.num_kv_splits, 2 * cfg.num_kv_splits)
    assert got.block_h == cfg.block_h
    assert (got.block_n, got.num_stages) == (cfg.block_n, cfg.num_stages)
    assert SPEC.is_valid(k, got)


def _recorded_best(key):
    """The fastest verified, non-baseline decode measurement of ``key`` in session 31's
    committed tuning database (tools/heuristic_report.py's reading of it)."""
    rows = tool("heuristic_report").recorded_rows(RESULTS / "session31/h200.sqlite")
    best = [row.best for row in rows if row.key == key]
    assert len(best) == 1, key
    return SPEC.parse_config(best[0])


def test_heuristic_large_batch_one_split():
    k = key(batch=64, context=8192, num_q_heads=32, num_kv_heads=8, head_dim=128,
            head_dim_v=128)
    assert SPEC.heuristic(k).num_kv_splits == 1


@pytest.mark.parametrize("batch,context,splits,pdl", [
    (4, 262144, 4, False), (8, 32768, 2, False), (1, 8192, 16, True), (64, 8192, 1, False)])
def test_gqa_heuristic_is_the_h200_sweeps_best(batch, context, splits, pdl):
    # bench/results/nvidia-h200/session14/h200.sqlite (the full valid space of every preset
    # key): 128-token tiles at 3 stages (one program per SM), whole waves of them: b8 x 32k
    # 253.1 us at 2 splits (254.5 at 4), b4 x 262k 974.0 at 4 (976.0 at 8; the best, 8 at 2
    # stages, 972.7), b64 x 8k unsplit; b1 x 8k at 16 with the reduce launched early (14.4
    # us against 16.1: a short call, pdl)
    k = key(batch=batch, context=context, num_q_heads=32, num_kv_heads=8, head_dim=128,
            head_dim_v=128)
    assert SPEC.heuristic(k) == DecodeConfig(num_kv_splits=splits, block_n=128, block_h=16,
                                             num_warps=4, num_stages=3, pdl=pdl)


def test_head_dim_64_bf16_splits_as_finely_as_fp8():
    """Rows of 128 bytes (bf16 head dim 64) take the fp8 ladder: llama3.2-1b b1 x 32,768 at
    32 splits with the early reduce, 0.891x the time of the 16 it took (session 22, same
    run); head dim 128 in bf16 keeps the coarser ladder."""
    d64 = dict(batch=1, context=32768, num_q_heads=32, num_kv_heads=8, head_dim=64,
               head_dim_v=64)
    assert SPEC.heuristic(key(**d64)).num_kv_splits == 32
    assert SPEC.heuristic(key(**d64, kv_dtype="float8_e4m3fn")).num_kv_splits == 32
    d128 = {**d64, "head_dim": 128, "head_dim_v": 128}
    assert SPEC.heuristic(key(**d128)).num_kv_splits == 16


@pytest.mark.parametrize("kw,splits", [
    # 128 heads b32 on both warpgroups a tile (fp8): one wave (2 splits) where two waves (4)
    # ran 1.017-1.037x its time (session 22)
    (dict(num_q_heads=128, batch=32, context=65536, page_size=64,
          kv_dtype="float8_e4m3fn"), 2),
    # ... the seesaw (bf16, at every page size: its rules measured at 64-token pages,
    # session 23): two waves where each split keeps 8k tokens (the one wave at 1.024x /
    # 1.031x the two waves' time at 32k / 64k)
    (dict(num_q_heads=128, batch=32, context=32768, page_size=64), 4),
    (dict(num_q_heads=128, batch=32, context=32768, page_size=16), 4),
    (dict(num_q_heads=128, batch=32, context=65536, page_size=64), 4),
    (dict(num_q_heads=128, batch=32, context=16384, page_size=64), 2),
    # ... and takes the forced second split from 16k tokens on, not from 8k (session 23:
    # unsplit 0.95x the time of 2 splits at two tokens b32 x 8,192, 0.99x at b128 x 8,192;
    # 2 splits best at every 16,384 key), at every page size
    (dict(num_q_heads=128, q_len=2, batch=32, context=8192, page_size=64), 1),
    (dict(num_q_heads=128, batch=128, context=8192, page_size=64), 1),
    (dict(num_q_heads=128, batch=128, context=16384, page_size=64), 2),
    (dict(num_q_heads=128, batch=128, context=8192, page_size=16), 1),
    (dict(num_q_heads=128, batch=128, context=16384, page_size=16), 2),
    # fp8: no forced second split (unsplit 1.01-1.05x faster at two tokens b32); bf16 keeps it
    (dict(num_q_heads=128, q_len=2, batch=32, context=32768, page_size=64,
          kv_dtype="float8_e4m3fn"), 1),
    (dict(num_q_heads=128, q_len=2, batch=32, context=32768, page_size=64), 2),
    # a one wave of 4 splits or more still doubles (16 heads x 2 tokens b32 x 393,216)
    (dict(num_q_heads=16, q_len=2, batch=32, context=393216), 8),
])
def test_the_wide_latent_tile_splits_as_measured(kw, splits):
    cfg = SPEC.heuristic(key(**kw))
    assert cfg.kernel == "gluon" and cfg.num_kv_splits == splits


def test_gqa_early_reduce_only_where_the_device_has_it_and_the_call_is_short():
    llama = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128)
    short = key(batch=1, context=8192, **llama)
    assert SPEC.heuristic(short).pdl and not SPEC.heuristic(key(batch=8, **llama)).pdl
    # up to 1 MiB of cache per SM (session 21's refit: b1 x 32k, 993 KiB, 0.973-0.978 of
    # the time without it in three tunes); not at 2 MiB (b1 x 65,536)
    assert SPEC.heuristic(key(batch=1, context=32768, **llama)).pdl
    assert not SPEC.heuristic(key(batch=1, context=65536, **llama)).pdl
    for device in ("nvidia-a100", "amd-mi355x"):  # no griddepcontrol: never pdl
        other = SPEC.key(Device.from_key(device), {**KIMI, **llama, "batch": 1,
                                                   "context": 8192})
        assert SPEC.heuristic(other).num_kv_splits > 1 and not SPEC.heuristic(other).pdl
    # the tuner times the heuristic first and its plain twin right after it
    cands = list(SPEC.tuning.candidates(short))
    assert cands[0] == SPEC.heuristic(short)
    assert cands[1] == SPEC.heuristic(short).model_copy(update={"pdl": False})
    assert SPEC.tuning.baseline(short) in cands and not SPEC.tuning.baseline(short).pdl


def test_gqa_one_program_per_sm_tiles_fill_whole_waves():
    # a bf16 128-token, 3-stage tile at head dim 128 takes more than half an SM's shared
    # memory: its split count never leaves a partial wave (132 SMs: 8 kv heads x 16 splits)
    k = key(batch=1, context=131072, num_q_heads=32, num_kv_heads=8, head_dim=128,
            head_dim_v=128)
    assert spec_module.one_per_sm(k, 128, 3) and SPEC.heuristic(k).num_kv_splits == 16
    # 55 heads do not tile 132 SMs (110 busy): the tile drops to 2 stages, 5 splits
    mha = key(batch=1, context=4096, num_q_heads=55, num_kv_heads=55, head_dim=96,
              head_dim_v=96)
    h = SPEC.heuristic(mha)
    assert (h.num_kv_splits, h.block_n, h.num_stages) == (5, 128, 2)
    # fp8 and head dim 64 tiles run several programs per SM: unchanged
    assert not spec_module.one_per_sm(key(head_dim=128, head_dim_v=128, num_q_heads=32,
                                          num_kv_heads=8, kv_dtype="float8_e4m3fn"), 128, 3)
    assert not spec_module.one_per_sm(key(head_dim=64, head_dim_v=64, num_q_heads=32,
                                          num_kv_heads=8), 128, 3)


@pytest.mark.parametrize("device,pdl", [("nvidia-h200", True), ("nvidia-h100", True),
                                        ("nvidia-a100", False), ("amd-mi355x", False)])
def test_pdl_is_a_candidate_for_split_grids_where_the_device_has_it(device, pdl):
    dev = Device.from_key(device)
    split = SPEC.key(dev, KIMI)
    heur = SPEC.heuristic(split)
    assert heur.num_kv_splits > 1 and not heur.pdl  # off by default (H200: no gain)
    assert not SPEC.tuning.baseline(split).pdl
    one = heur.model_copy(update={"num_kv_splits": 1, "pdl": True})
    assert not SPEC.is_valid(split, one)  # no reduce to launch early
    early = heur.model_copy(update={"pdl": True})
    assert SPEC.is_valid(split, early) is pdl
    cands = list(SPEC.tuning.candidates(split))
    assert all(SPEC.is_valid(split, c) for c in cands)
    assert (early in cands) is pdl  # the tuner measures the early reduce beside the heuristic


def test_heuristic_respects_min_tokens_and_budget():
    short = key(batch=1, context=64)
    assert SPEC.heuristic(short).num_kv_splits <= 2
    for batch in (1, 8, 64, 512):
        for hq in (12, 128):
            k = key(batch=batch, num_q_heads=hq)
            cfg = SPEC.heuristic(k)
            assert _workspace_bytes(k, cfg.num_kv_splits) <= WORKSPACE_BUDGET
            assert SPEC.is_valid(k, cfg)
    inv = key(batch_invariant=True, num_q_heads=128)
    assert _workspace_bytes(inv, SPEC.heuristic(inv).num_kv_splits) <= WORKSPACE_BUDGET


def test_batch_invariant_split_count_does_not_depend_on_batch():
    cfgs = {SPEC.heuristic(key(batch=b, batch_invariant=True)) for b in (1, 3, 8, 64)}
    assert len(cfgs) == 1


def test_is_valid_rejects_over_budget_and_oversized():
    k = key(batch=512, num_q_heads=128)
    assert not SPEC.is_valid(k, DecodeConfig(num_kv_splits=256, block_h=16))
    assert not SPEC.is_valid(key(), DecodeConfig(block_h=64))  # 12 heads: block_h <= 16
    assert not SPEC.is_valid(key(), DecodeConfig(block_n=256, num_stages=3))  # shared memory


@pytest.mark.parametrize("kw", [{}, dict(batch=1, context=65536), dict(batch=32, num_q_heads=128,
                                                                       context=16384),
                                dict(batch=4, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                     head_dim_v=128, context=262144)])
def test_candidates_bounded_valid_and_include_defaults(kw):
    k = key(**kw)
    cands = list(SPEC.tuning.candidates(k))
    assert 8 <= len(cands) <= MAX_CANDIDATES
    assert len(set(cands)) == len(cands)
    assert all(SPEC.is_valid(k, c) for c in cands)
    assert SPEC.heuristic(k) in cands and SPEC.tuning.baseline(k) in cands
    assert SPEC.tuning.baseline(k).num_kv_splits == 1
    assert len({c.num_kv_splits for c in cands}) >= 3


def test_tolerance_and_bytes():
    assert SPEC.tuning.tolerance(key(dtype="float32"))[0] < SPEC.tuning.tolerance(key(dtype="float16"))[0] \
        < SPEC.tuning.tolerance(key())[0]
    k = key()
    mla = SPEC.tuning.bytes_moved(k)
    assert mla >= k.batch * k.context * 576 * 2  # latent once
    assert mla < k.batch * k.context * (576 + 512) * 2  # not K and V separately
    g = key(num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128)
    assert SPEC.tuning.bytes_moved(g) >= g.batch * g.context * 8 * 256 * 2


def test_make_inputs_map_to_key_on_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the checks on a GPU host too
    k = SPEC.key(Device.interpreter(), dict(KIMI, batch=2, context=64, num_q_heads=4))
    inp = SPEC.tuning.make_inputs(k, "cpu", seed=1)
    assert inp["v_cache"].data_ptr() == inp["k_cache"].data_ptr()
    assert inp["q"].abs().sum() > 0 and inp["k_cache"].float().abs().sum() > 0
    assert int(inp["seq_lens"].max()) <= inp["block_table"].shape[1] * 16
    assert SPEC.key(Device.interpreter(), inp) == k
    pages = inp["block_table"].flatten()
    assert len(set(pages.tolist())) == pages.numel()


@pytest.mark.parametrize("device", ["nvidia-h200", "nvidia-a100", "amd-mi355x"])
def test_merge_is_a_candidate_for_split_grids(device):
    split = SPEC.key(Device.from_key(device), KIMI)
    heur = SPEC.heuristic(split)
    assert heur.num_kv_splits > 1 and not SPEC.tuning.baseline(split).merge
    twin = heur.model_copy(update={"merge": not heur.merge, "pdl": False})
    cands = list(SPEC.tuning.candidates(split))
    assert cands[0] == heur and twin in cands[:3]  # measured right beside the heuristic
    assert all(SPEC.is_valid(split, c) for c in cands)
    assert not SPEC.is_valid(split, heur.model_copy(update={"num_kv_splits": 1,
                                                            "merge": True}))
    assert not SPEC.is_valid(split, heur.model_copy(update={"merge": True, "pdl": True}))


@pytest.mark.parametrize("kw,splits,merge", [
    (dict(batch=32, num_q_heads=16, context=16384), 8, False),   # deepseek TP8 b32 x 16k
    (dict(batch=32, num_q_heads=128, context=16384), 2, True),   # TP1: 2 blocks of 64 heads
    ({}, 33, False),                                             # kimi b8: serial merge of 33
    (dict(batch=1, context=65536), 128, False),
    (dict(batch=4, num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128,
          context=262144), 4, False),                            # GQA keeps the reduce kernel
])
def test_heuristic_merges_latent_grids_of_few_splits(kw, splits, merge, monkeypatch):
    # the Triton tiles' rule (128 heads on 16-token pages take the Gluon tile on sm_90)
    monkeypatch.setattr(spec_module, "gluon_fits", lambda k: False)
    h = SPEC.heuristic(key(**kw))
    assert (h.num_kv_splits, h.merge, h.pdl) == (splits, merge, False)


def test_merge_heuristic_only_where_measured(monkeypatch):
    kw = dict(batch=32, num_q_heads=128, context=16384)
    assert SPEC.heuristic(SPEC.key(H200, {**KIMI, **kw})) == spec_module.gluon_config(2)
    monkeypatch.setattr(spec_module, "gluon_fits", lambda k: False)  # the Triton tile's rule
    nv = SPEC.heuristic(SPEC.key(H200, {**KIMI, **kw}))
    assert 1 < nv.num_kv_splits <= 4 and nv.merge  # measured on the H200
    k = SPEC.key(Device.from_key("amd-mi355x"), {**KIMI, **kw})
    h = SPEC.heuristic(k)
    assert 1 < h.num_kv_splits <= 4 and not h.merge  # not measured on AMD: a candidate only
    assert h.model_copy(update={"merge": True}) in list(SPEC.tuning.candidates(k))
