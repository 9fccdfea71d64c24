"""The Gluon stage 1 as a dispatch choice (``DecodeConfig.kernel``), on the CPU: which keys
it serves, what the heuristic and the tuner pick, how its config serializes, and how a
call it cannot take (here: the interpreter) runs the Triton tile instead."""

from __future__ import annotations

import pytest
import torch

from kdispatch.device import Device
from kdispatch.kernels.decode_attention import launch as L
from kdispatch.kernels.decode_attention import reference_decode_attention, spec
from kdispatch.kernels.decode_attention.gluon_mla import _gluon_mla_stage1
from kdispatch.kernels.decode_attention.kernels import _decode_reduce
from kdispatch.kernels.decode_attention.launch import (checked_plan, launch_decode_attention,
                                                       launches, plan)
from kdispatch.registry import get_op
from kdispatch.store import digest

OP = get_op("decode_attention")
H200 = Device.from_key("nvidia-h200")
DP = dict(batch=32, context=16384, num_q_heads=128, num_kv_heads=1, head_dim=576,
          head_dim_v=512, page_size=64, dtype="bfloat16")


def _key(device=H200, **change):
    return OP.key(device, OP.plain_args({**DP, **change}))


def test_the_heuristic_takes_the_gluon_tile_for_128_heads_on_64_token_pages():
    h = OP.heuristic(_key())
    assert h == spec.gluon_config(2)  # 32 x 2 head blocks x 2 splits: one program per SM
    # b128: 256 programs (1.9 waves) unsplit; a second split evens out the last wave at
    # 8k tokens or more (session 18's tune at 16,384: 1,337 vs 1,413 us unsplit), not at a
    # 4k context, nor at 4 waves or more unsplit (b512: 1,024 programs)
    assert OP.heuristic(_key(batch=128)) == spec.gluon_config(2)
    assert OP.heuristic(_key(batch=128, context=4096)) == spec.gluon_config(1)
    assert OP.heuristic(_key(batch=256)) == spec.gluon_config(2)  # 512 programs: 3.9 waves
    assert OP.heuristic(_key(batch=512)) == spec.gluon_config(1)
    assert OP.heuristic(_key(num_q_heads=64)).kernel == "gluon"


@pytest.mark.parametrize("change", [
    dict(page_size=8), dict(page_size=128),
    dict(page_size=1), dict(num_q_heads=8),
    dict(num_q_heads=12), dict(num_q_heads=4, q_len=2), dict(sliding_window=4096),
    dict(head_dim=128, head_dim_v=128, num_kv_heads=8)])
def test_keys_the_gluon_tile_does_not_serve_keep_the_triton_tiles(change):
    key = _key(**change)
    assert not spec.gluon_fits(key)
    assert OP.heuristic(key).kernel == "triton"
    assert not spec.is_valid(key, spec.gluon_config(2))
    assert all(c.kernel == "triton" for c in OP.tuning.candidates(key))


@pytest.mark.parametrize("change, gluon", [
    (dict(), True), (dict(q_len=2), True), (dict(page_size=16), True),
    (dict(num_q_heads=16, q_len=2, page_size=16), True),
    (dict(num_q_heads=12, q_len=2, page_size=16, batch=8, context=393216), True),
    (dict(num_q_heads=16, page_size=16), False), (dict(num_q_heads=12, page_size=16), False)])
def test_fp8_latents_take_the_gluon_tile_past_16_rows(change, gluon):
    """An fp8 (e4m3) latent runs on the Gluon tile (converted to fp16 per tile) from 16
    rows on, and the heuristic takes it past 16 rows as for bf16: session 20's tune of
    every preset key (bench/results/nvidia-h200/session20/h200.sqlite) has it the best or
    within 1.5% of it at every such fp8 key, and a same-run sweep (call 1) timed it at
    0.68-0.84x the best Triton tile's time (128 heads b32 x 16,384: 487.7 vs 683.1 us;
    16 heads x 2 tokens: 248.0 vs 294.9). 16 rows take the narrow fp8 tile instead."""
    key = _key(kv_dtype="float8_e4m3fn", **change)
    assert spec.gluon_fits(key) == (key.rows >= spec.GLUON_MIN_ROWS)
    h = OP.heuristic(key)
    assert (h.kernel == "gluon" and h.block_h == 64) == gluon
    assert (h == spec.narrow_config(h.num_kv_splits, key.rows)) == (key.rows <= 16)
    if spec.gluon_fits(key):
        assert any(c.kernel == "gluon" for c in OP.tuning.candidates(key))
    # AMD's fnuz fp8 never takes it
    assert not spec.gluon_fits(key.model_copy(update={"kv_dtype": "float8_e4m3fnuz"}))


@pytest.mark.parametrize("change, plan", [
    (dict(batch=128), True), (dict(batch=128, context=65536), True),
    (dict(q_len=2), True), (dict(q_len=2, batch=128), True),
    (dict(), False),  # two splits: the split grid
    (dict(batch=128, batch_invariant=True), False),  # the plan is never batch invariant
    (dict(num_q_heads=16, q_len=2, batch=256), False)])  # 32 rows: no tune timed it
def test_fp8_latents_at_one_split_take_the_work_plan(change, plan):
    """The Gluon fp8 form at one split runs the work plan where its 64 rows are full:
    session 29's tune (bench/results/nvidia-h200/session29/h200.sqlite) had the plan best
    at all 12 such 128-head keys, 1.002-1.075x the speed of one split without it (b32 x
    65,536 x 2 tokens: 3,158.9 vs 3,387.8 us); the bf16 seesaw, two splits and tiles of
    fewer rows (never timed with the plan at one split) keep the split grid."""
    kw = {k: v for k, v in change.items() if k != "batch_invariant"}
    key = _key(kv_dtype="float8_e4m3fn", **kw)
    if change.get("batch_invariant"):
        key = key.model_copy(update={"batch_invariant": True})
    h = OP.heuristic(key)
    assert h.kernel == "gluon" and h.plan == plan
    assert h.num_kv_splits == (1 if plan or "batch" in change else 2)
    assert not OP.heuristic(_key(**kw)).plan  # bf16: never


def test_an_fp8_gluon_plan_passes_its_scales():
    """KV_FP8 / KV_SCALED in the plan's constexprs, the scale tensors as the stage 1's
    KS / VS arguments (the lengths stand in, unread, for an unscaled cache)."""
    b, hq, splits = 3, 128, 2
    g = plan(spec.gluon_config(splits), b, hq, 576, 64, 1, 512, True, False, False, False,
             kv_fp8=True, scaled=True, gluon=True)
    assert g.constexprs["KV_FP8"] and g.constexprs["KV_SCALED"]
    unscaled = plan(spec.gluon_config(splits), b, hq, 576, 64, 1, 512, True, False, False,
                    False, kv_fp8=True, scaled=False, gluon=True)
    assert unscaled.constexprs["KV_FP8"] and not unscaled.constexprs["KV_SCALED"]
    bf16 = plan(spec.gluon_config(splits), b, hq, 576, 64, 1, 512, True, False, False, False,
                gluon=True)
    assert not bf16.constexprs["KV_FP8"] and not bf16.constexprs["KV_SCALED"]
    q = torch.zeros(b, hq, 576, dtype=torch.bfloat16)
    k = torch.zeros(5, 64, 1, 576, dtype=torch.float8_e4m3fn)
    bt, sl = torch.zeros(b, 4, dtype=torch.int32), torch.ones(b, dtype=torch.int32)
    ks, vs = torch.full((1,), 0.5), torch.full((1,), 0.25)
    names = _gluon_mla_stage1.arg_names
    for p, want in ((g, (ks, vs)), (unscaled, (sl, sl))):
        stage1 = launches(p, q, k, k[..., :512], bt, sl, q.new_empty(p.out_shape), 0.1, 0.0,
                          0, ks, vs)[0]
        got = dict(zip(names, stage1.args))
        assert got["KS"] is want[0] and got["VS"] is want[1]
        assert got["q_desc"].block_shape == [64, 512]
        assert got["kv_desc"].base.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("page", [16, 32])
def test_pages_of_16_and_32_tokens_fit_the_64_token_tile(page):
    """The tile stays 64 tokens (``block_n``) of ``64 // page`` pages: the same config; the
    heuristic's rule (more than 16 rows) takes it there as on 64-token pages."""
    key = _key(page_size=page)
    assert spec.gluon_fits(key) and spec.is_valid(key, spec.gluon_config(2))
    assert OP.heuristic(key) == spec.gluon_config(2)
    for change, gluon in ((dict(num_q_heads=16), False), (dict(num_q_heads=16, q_len=2), True)):
        k = _key(page_size=page, **change)
        assert spec.gluon_fits(k) and (OP.heuristic(k).kernel == "gluon") == gluon
        assert any(c.kernel == "gluon" for c in OP.tuning.candidates(k))
    g = plan(spec.gluon_config(4), 3, 16, 576, page, 1, 512, True, False, False, False, 2, True,
             gluon=True)
    assert g.constexprs["PAGE"] == page and g.constexprs["BLOCK_N"] == 64
    assert g.reduce_constexprs["BLOCK_N"] == 64 and g.grid == (1, 3, 4)


@pytest.mark.parametrize("change, gluon", [
    (dict(num_q_heads=16), False), (dict(num_q_heads=12, q_len=2), True),
    (dict(num_q_heads=16, q_len=2), True), (dict(num_q_heads=16, q_len=4), True),
    (dict(num_q_heads=96), True), (dict(q_len=2), True)])
def test_row_tiles_the_gluon_tile_serves(change, gluon):
    """(token, head) rows of one request in 64-row tiles: gluon_fits from 16 rows on, the
    tuner times it there; the heuristic takes it past 16 rows (H200: 16 heads x 2 tokens
    189 vs 225 us, 12 x 2 42 vs 52 at b1 x 65,536; 16 x 1 177 vs 163)."""
    key = _key(**change)
    assert spec.gluon_fits(key) and spec.is_valid(key, spec.gluon_config(2))
    assert (OP.heuristic(key).kernel == "gluon") == gluon
    assert any(c.kernel == "gluon" for c in OP.tuning.candidates(key))


@pytest.mark.parametrize("hq, q_len, q4d", [(16, 2, True), (16, 4, True), (128, 2, True),
                                            (12, 2, True), (16, 1, False), (64, 1, True)])
def test_the_gluon_plan_orders_rows_as_the_triton_latent_tile(hq, q_len, q4d):
    b, splits = 3, 4
    g = plan(spec.gluon_config(splits), b, hq, 576, 64, 1, 512, True, False, False, False,
             q_len, q4d, gluon=True)
    t = plan(spec.DecodeConfig(num_kv_splits=splits, block_n=64, block_h=64, num_warps=8,
                               num_stages=2), b, hq, 576, 64, 1, 512, True, False, False,
             False, q_len, q4d)
    assert g.gluon and g.grid == t.grid == (-(-q_len * hq // 64), b, splits)
    assert g.partials_shape == t.partials_shape == (b, hq * q_len, splits, 512)
    assert g.out_shape == t.out_shape
    assert g.constexprs["QLEN"] == q_len and g.reduce_constexprs["QLEN"] == q_len
    assert g.reduce_grid[0] == hq * q_len and g.reduce_grid[2] == b


@pytest.mark.parametrize("hq, q_len, page", [(128, 1, 64), (16, 2, 16)])
def test_a_gluon_plan_launches_its_stage_1_and_the_triton_tiles_reduce_without_a_zero_row(
        monkeypatch, hq, q_len, page):
    """The Gluon stage 1 with the plan's constexprs, then the reduce the Triton latent plan of
    the same tile and split count launches; no zero row is made (the Gluon tile reads none)."""
    monkeypatch.setattr(L, "zero_row", lambda *a: pytest.fail("a zero row for a Gluon plan"))
    b, splits = 3, 4
    g = plan(spec.gluon_config(splits), b, hq, 576, page, 1, 512, True, False, False, False,
             q_len, q_len > 1, gluon=True)
    t = plan(spec.DecodeConfig(num_kv_splits=splits, block_n=64, block_h=64, num_warps=8,
                               num_stages=2), b, hq, 576, page, 1, 512, True, False, False,
             False, q_len, q_len > 1)
    q = torch.zeros(b, q_len, hq, 576, dtype=torch.bfloat16)
    q = q if q_len > 1 else q[:, 0]
    k = torch.zeros(5, page, 1, 576, dtype=torch.bfloat16)
    bt, sl = torch.zeros(b, 4, dtype=torch.int32), torch.ones(b, dtype=torch.int32)
    stage1, reduce = launches(g, q, k, k[..., :512], bt, sl, q.new_empty(g.out_shape), 0.1,
                              0.0, 0)
    assert stage1.fn is _gluon_mla_stage1 and stage1.grid == g.grid == t.grid
    # 12 warps at launch, 12 x 32 threads x MAXNREG registers: a bf16 latent at every page
    # size is the seesaw's first warpgroup (4, the default partition), its second and the
    # copy warp's group (fp8: both warpgroups, 8 warps, and the copy warp's group)
    assert stage1.constexprs == g.constexprs
    assert stage1.options == {"num_warps": 4, "maxnreg": 168} and 12 * 32 * 168 <= 65536
    assert reduce.fn is _decode_reduce and reduce.grid == t.reduce_grid
    assert (reduce.constexprs, reduce.options) == (t.reduce_constexprs, t.reduce_options)


def test_other_devices_never_get_the_gluon_tile():
    for dev in (Device.from_key("cpu-interpreter"), Device.from_key("amd-mi300x"),
                Device.from_key("nvidia-a100")):
        key = _key(device=dev)
        assert not spec.gluon_fits(key) and OP.heuristic(key).kernel == "triton"


def test_the_gluon_tile_is_fixed_and_the_tuner_times_it_at_every_split_count():
    key = _key()
    for change in (dict(pdl=True), dict(merge=True), dict(block_n=32), dict(num_warps=4),
                   dict(num_stages=3), dict(block_h=32)):
        assert not spec.is_valid(key, spec.gluon_config(2).model_copy(update=change)), change
    cands = OP.tuning.candidates(key)
    assert cands[0] == spec.gluon_config(2)
    gluon = [c.num_kv_splits for c in cands if c.kernel == "gluon" and not c.plan]
    assert {1, 2, 4} <= set(gluon) and len(gluon) == len(set(gluon))
    # the Triton tile at the heuristic's split count is timed beside it
    assert any(c.kernel == "triton" and c.block_h == 64 and c.num_kv_splits == 2
               for c in cands[:3])


def test_a_triton_config_serializes_as_before_the_kernel_field():
    cfg = spec.DecodeConfig(num_kv_splits=8, block_n=32, block_h=16, num_stages=3)
    dumped = cfg.model_dump(mode="json")
    assert "kernel" not in dumped and "kernel" not in cfg.model_dump_json()
    assert digest(dumped) == digest({"num_warps": 4, "num_kv_splits": 8, "block_n": 32,
                                     "block_h": 16, "num_stages": 3, "pdl": False,
                                     "merge": False})
    g = spec.gluon_config(3)
    assert g.model_dump(mode="json")["kernel"] == "gluon"
    assert spec.DecodeConfig.model_validate_json(g.model_dump_json()) == g
    with pytest.raises(ValueError, match="kernel"):
        spec.DecodeConfig(kernel="cuda")


@pytest.mark.parametrize("hq, q_len, page, fp8", [(64, 1, 64, False), (16, 2, 64, False),
                                                 (16, 2, 16, False), (16, 2, 16, True)])
def test_on_the_interpreter_a_gluon_config_runs_the_triton_tile_correctly(hq, q_len, page,
                                                                          fp8):
    g = torch.Generator().manual_seed(0)
    b, nb = 2, 6 * 64 // page
    k = torch.randn(nb, page, 1, 576, generator=g).to(torch.bfloat16)
    if fp8:
        k = k.to(torch.float8_e4m3fn)
    v = k[..., :512]
    shape = (b, hq) if q_len == 1 else (b, q_len, hq)
    q = torch.randn(*shape, 576, generator=g).to(torch.bfloat16)
    r = 64 // page  # each 64-token block of the table as r pages
    bt = torch.tensor([[x * r + j if x >= 0 else -1 for x in row for j in range(r)]
                       for row in ([4, 1, 0], [2, 5, -1])], dtype=torch.int32)
    sl = torch.tensor([129, 65], dtype=torch.int32)
    cfg = spec.gluon_config(2)
    p = checked_plan(cfg, q, k, v, bt, sl, None, 0.0)
    assert not p.gluon and p.latent and p.grid == (-(-q_len * hq // 64), b, 2)
    out = launch_decode_attention(cfg, q, k, v, bt, sl, scale=576 ** -0.5)
    ref = reference_decode_attention(q, k, v, bt, sl, scale=576 ** -0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_the_seesaw_rule_is_the_same_for_keys_and_calls():
    """The heuristic's reading of a key (spec.seesaw_key: its split rule) and the launch's
    reading of a call (gluon_mla.seesaw: the kernel form, its warps) agree: the seesaw for
    bf16 latents at every page size, both warpgroups on each tile for fp8."""
    from kdispatch.kernels.decode_attention import gluon_mla as G

    seen = set()
    for page in spec.GLUON_PAGE_SIZES:
        for kv in spec.GLUON_KV_DTYPES:
            key = _key(page_size=page, kv_dtype=kv)
            assert spec.gluon_fits(key)
            got, fp8 = spec.seesaw_key(key), kv == "float8_e4m3fn"
            assert got == G.seesaw(fp8), (page, kv)
            assert G.launch_options(fp8)["num_warps"] == (4 if got else 8)
            seen.add((page, kv, got))
    assert {(p, kv) for p, kv, s in seen if s} == {(p, "bfloat16")
                                                   for p in spec.GLUON_PAGE_SIZES}


@pytest.mark.parametrize("change, fits", [
    (dict(num_q_heads=16, page_size=16), True), (dict(num_q_heads=12, page_size=16), True),
    (dict(num_q_heads=8, q_len=2, page_size=32), True), (dict(num_q_heads=16), True),
    (dict(num_q_heads=16, q_len=2, page_size=16), False),  # 32 rows
    (dict(num_q_heads=12, q_len=3, page_size=16), False),
    (dict(num_q_heads=16, page_size=8), False), (dict(num_q_heads=16, sliding_window=4096), False),
    (dict(), False)])  # 128 heads
def test_the_narrow_fp8_tile_serves_fp8_latents_of_up_to_16_rows(change, fits):
    """``gluon_mla_narrow`` (the tokens as the MMA's M, a request's rows its N): fp8
    latents only, the 64-row tile's pages and latent, at most 16 rows a request; its config
    is fixed but for the split count and the tuner times it at every split count it
    times."""
    key = _key(kv_dtype="float8_e4m3fn", **change)
    assert spec.narrow_fits(key) == fits
    cfg = spec.narrow_config(4, key.rows)
    assert cfg.kernel == "gluon" and cfg.block_h == (16 if key.rows <= 16 else 32)
    assert spec.is_valid(key, cfg) == fits
    assert any(c == cfg.model_copy(update={"num_kv_splits": c.num_kv_splits})
               for c in OP.tuning.candidates(key)) == fits
    assert not spec.is_valid(key, cfg.model_copy(update={"num_warps": 8}))
    bf16 = _key(**change)
    assert not spec.narrow_fits(bf16) and not spec.is_valid(bf16, spec.narrow_config(4, 16))
    assert spec.DecodeConfig(**cfg.model_dump()) == cfg


@pytest.mark.parametrize("hq, q_len, page, scaled", [(16, 1, 16, True), (12, 1, 64, False),
                                                     (8, 2, 32, True)])
def test_a_narrow_plan_launches_its_stage_1_with_its_rows_and_scales(hq, q_len, page, scaled):
    """The narrow tile's plan: one program a request's rows (16) and split, the
    partials and reduce of the 64-row tile's plan at the same split count, its warps and
    stages from the config, the scale tensors as KS / VS (the lengths, unread, without)."""
    from kdispatch.kernels.decode_attention.gluon_mla_narrow import _narrow_stage1
    b, splits = 3, 4
    cfg = spec.narrow_config(splits, hq * q_len)
    n = plan(cfg, b, hq, 576, page, 1, 512, True, False, False, False, q_len, q_len > 1,
             kv_fp8=True, scaled=scaled, gluon=True)
    g = plan(spec.gluon_config(splits), b, hq, 576, page, 1, 512, True, False, False, False,
             q_len, q_len > 1, kv_fp8=True, scaled=scaled, gluon=True)
    assert n.narrow and not g.narrow and n.grid == (1, b, splits) == g.grid
    assert n.partials_shape == g.partials_shape and n.reduce_grid == g.reduce_grid
    assert n.constexprs["NROWS"] == cfg.block_h == 16 and n.constexprs["STAGES"] == 2
    assert n.constexprs["KV_SCALED"] == scaled and n.options == {"num_warps": 4}
    q = torch.zeros(b, q_len, hq, 576, dtype=torch.bfloat16)
    q = q if q_len > 1 else q[:, 0]
    k = torch.zeros(5, page, 1, 576, dtype=torch.float8_e4m3fn)
    bt, sl = torch.zeros(b, 4, dtype=torch.int32), torch.ones(b, dtype=torch.int32)
    ks, vs = torch.full((1,), 0.5), torch.full((1,), 0.25)
    stage1, reduce = launches(n, q, k, k[..., :512], bt, sl, q.new_empty(n.out_shape), 0.1,
                              0.0, 0, ks if scaled else None, vs if scaled else None)
    assert stage1.fn is _narrow_stage1 and stage1.constexprs == n.constexprs
    got = dict(zip(_narrow_stage1.arg_names, stage1.args))
    assert (got["KS"], got["VS"]) == ((ks, vs) if scaled else (sl, sl))
    assert got["kv_desc"].block_shape == [page, 512] and got["heads"] == hq
    po = got["PO"]
    assert tuple(po.shape) == n.partials_shape[:3] + (512,)
    assert reduce.fn is _decode_reduce and reduce.args[1] is po


def test_a_narrow_config_in_the_interpreter_runs_the_triton_tile():
    """A call the narrow tile cannot take (the interpreter) runs the Triton latent tile at
    the config's split count and matches the reference."""
    g = torch.Generator().manual_seed(3)
    b, hq, page = 2, 16, 16
    k = (torch.randn(6, page, 1, 576, generator=g) * 0.5).to(torch.float8_e4m3fn)
    q = torch.randn(b, hq, 576, generator=g).to(torch.bfloat16)
    bt = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32)
    sl = torch.tensor([17, 40], dtype=torch.int32)
    cfg = spec.narrow_config(2, hq)
    assert not checked_plan(cfg, q, k, k[..., :512], bt, sl, None, 0.0).gluon
    out = launch_decode_attention(cfg, q, k, k[..., :512], bt, sl, scale=576 ** -0.5)
    ref = reference_decode_attention(q, k, k[..., :512], bt, sl, scale=576 ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("heads, batch, context, splits", [
    (12, 1, 65536, 128), (12, 1, 393216, 132), (12, 8, 65536, 33), (12, 8, 393216, 33),
    (16, 8, 16384, 16), (16, 8, 393216, 33), (16, 32, 16384, 8), (16, 32, 393216, 8)])
def test_the_heuristic_takes_the_narrow_tile_for_fp8_latents_of_16_rows(heads, batch,
                                                                       context, splits):
    """16 rows of an fp8 latent: the narrow tile at whole waves of one program per SM, two
    where a split keeps 1,024 tokens and two waves fit in MAX_SPLITS (session 31's tune:
    the best split count of its fp16-score form at every such key it timed; b1 x 393,216
    took 1.14x as long at 256 splits as at 132); bf16 keeps the Triton tile."""
    key = _key(kv_dtype="float8_e4m3fn", num_q_heads=heads, batch=batch, context=context,
               page_size=16)
    assert OP.heuristic(key) == spec.narrow_config(splits, heads)
    assert OP.heuristic(_key(num_q_heads=heads, batch=batch, context=context,
                             page_size=16)).kernel == "triton"
