"""The balanced split grid of decode_attention (interpreter on CPU, or the GPU).

A batch of ragged lengths runs on a grid of up to ``BALANCE_HEADROOM`` times the config's
splits, each request cut into chunks no shorter than the batch's mean live length over
the config's count. Stage 1's partials are read back and compared, split by split, with a
Python mirror of that rule and an fp32 log-sum-exp of each split's tokens; the output is
compared with the reference; ``batch_invariant`` keeps the per-request grid.
"""

from __future__ import annotations

import pytest
import torch

from kdispatch.kernels.decode_attention import (DecodeConfig, launch_decode_attention,
                                                reference_decode_attention)
from kdispatch.kernels.decode_attention.launch import plan, planned_launches
from kdispatch.kernels.decode_attention.spec import (BALANCE_HEADROOM, MAX_SPLITS,
                                                     WORKSPACE_BUDGET, gluon_config,
                                                     grid_splits)
from tests.kernels.test_decode_attention import TOL, cfg, make_case

LOG2E = 1.4426950408889634
EDGES = [1, 15, 16, 17, 63, 64, 65, 150]


def mirror(lens, splits, grid, block_n, max_len, window=None, q_len=1):
    """Each request's ``grid`` split ranges ``[(start, end), ...]`` as the kernels cut them."""
    lens = [min(max(n, 0), max_len) for n in lens]
    lo = [max(n - (q_len - 1) - window, 0) if window else 0 for n in lens]
    live = [n - s for n, s in zip(lens, lo)]
    mean = -(-sum(live) // len(lens))

    def tiles(n):
        return -(-n // block_n) * block_n

    out = []
    for n, s, lv in zip(lens, lo, live):
        chunk = max(tiles(-(-lv // grid)), block_n)
        if grid > splits:
            chunk = max(chunk, tiles(-(-mean // splits)))
        out.append([(s + i * chunk, min(s + (i + 1) * chunk, n)) for i in range(grid)])
    return out


def split_lse(q, k, bt, b, start, end, scale, group):
    """fp32 log2-sum-exp of request ``b``'s scores over tokens ``[start, end)``, per head."""
    page = k.shape[1]
    t = torch.arange(start, end)
    rows = k[bt[b, t // page].long(), t % page].float()  # [n, hk, dk]
    heads = torch.arange(q.shape[1])
    s = torch.einsum("hd,nhd->hn", q[b].float(), rows[:, heads // group]) * scale
    return torch.logsumexp(s, dim=1) * LOG2E


def stage1_partials(config, q, k, v, bt, sl, scale, **kw):
    """Run stage 1 alone with its workspace filled with NaN; (grid, lse partials)."""
    todo = planned_launches(config, q, k, v, bt, sl, scale=scale, **kw)
    stage1 = todo[0]
    names = stage1.fn.arg_names
    po, pl = stage1.args[names.index("PO")], stage1.args[names.index("PL")]
    pl.fill_(float("nan"))
    po.fill_(float("nan"))
    stage1.run()
    return stage1.grid, pl.cpu()


def check_ranges(config, q, k, v, bt, sl, scale, grid_expected, **kw):
    grid, pl = stage1_partials(config, q, k, v, bt, sl, scale, **kw)
    assert grid[2] == grid_expected
    lens = sl.tolist()
    max_len = bt.shape[1] * k.shape[1]
    ranges = mirror(lens, config.num_kv_splits, grid[2], config.block_n, max_len)
    group = q.shape[1] // k.shape[2]
    qc, kc, btc = q.cpu(), k.cpu(), bt.cpu()
    for b, req in enumerate(ranges):
        for s, (start, end) in enumerate(req):
            if start >= end:  # never written: the NaN fill stays
                assert torch.isnan(pl[b, :, s]).all(), (b, s)
                continue
            want = split_lse(qc, kc, btc, b, start, end, scale, group)
            torch.testing.assert_close(pl[b, :, s], want, atol=2e-4, rtol=2e-4)
    return ranges


def test_grid_splits_headroom_and_caps():
    assert grid_splits(4, 8, 32, 128, 1 << 20, 64) == BALANCE_HEADROOM * 4
    assert grid_splits(200, 8, 32, 128, 1 << 20, 64) == MAX_SPLITS
    assert grid_splits(4, 8, 32, 128, 6 * 64, 64) == 6   # one split per tile of the table
    assert grid_splits(4, 8, 32, 128, 2 * 64, 64) == 4   # never below the config's count
    per_split = 256 * 128 * 513 * 4
    assert grid_splits(4, 256, 128, 512, 1 << 20, 64) == max(4, WORKSPACE_BUDGET // per_split)


def test_a_grid_that_fits_one_wave_with_room_keeps_within_the_resident_slots():
    """H200 session 17: head dim 64 (three programs per SM) at b8 x 32k, 4 splits: 256 busy
    programs in 396 slots; 8 grid splits (512 programs) cost 1.08-1.10x, 5-6 nothing."""
    assert grid_splits(4, 8, 32, 64, 32768, 128, 64, 3, 132) == 6      # 6 x 64 <= 396
    assert grid_splits(8, 4, 32, 64, 262144, 128, 32, 3, 132) == 12    # b4 x 262k
    assert grid_splits(4, 8, 32, 64, 32768, 128, 64, 3, 0) == 8        # SMs unknown
    assert grid_splits(4, 8, 32, 64, 32768, 128, 64, 1, 132) == 8      # one per SM
    # busy programs that fill the slots (Kimi: 8 x 33 in 2 x 132) or that take nearly every
    # SM when packed (DeepSeek TP8: 256 busy two to an SM take 128 of 132) keep 2x
    assert grid_splits(33, 8, 12, 512, 327680, 32, 8, 2, 132) == 66
    assert grid_splits(8, 32, 16, 512, 16384, 32, 32, 2, 132) == 16
    # a multi-wave config is not capped
    assert grid_splits(8, 64, 32, 64, 32768, 128, 512, 3, 132) == 16


def test_plan_balances_only_where_it_can():
    args = dict(b=8, hq=8, dk=64, page=16, hk=2, dv=64, shared=False, q_float32=True,
                sliding=False, capped=False, table_tokens=4096)
    p = plan(cfg(4), **args, balance=True)
    assert p.grid == (2, 8, 8) and p.partials_shape == (8, 8, 8, 64)
    assert p.constexprs["GRID_SPLITS"] == 8 and p.constexprs["NUM_KV_SPLITS"] == 4
    assert p.reduce_constexprs["GRID_SPLITS"] == 8 and p.reduce_constexprs["SPLITS_P2"] == 16
    assert plan(cfg(4), **args).grid == (2, 8, 4)                       # batch invariant
    d64 = dict(args, hq=32, hk=8, q_float32=False, table_tokens=32768)
    d64cfg = cfg(4, block_n=128, num_stages=3)  # 67,584 B of shared memory: 3 per SM
    assert plan(d64cfg, **d64, balance=True).grid == (8, 8, 8)
    assert plan(d64cfg, **d64, balance=True, cu_count=132).grid == (8, 8, 6)
    assert plan(cfg(4), **{**args, "b": 1}, balance=True).grid == (2, 1, 4)  # nothing to balance
    assert plan(cfg(1), **args, balance=True).grid == (2, 8, 1)         # direct: no partials
    lat = dict(args, dk=576, dv=512, hk=1, shared=True)
    assert plan(cfg(2, block_h=16), **lat, balance=True).grid[2] == 4
    assert plan(cfg(2, block_h=64), **lat, balance=True).grid[2] == 2   # the 64-row tile
    g = plan(gluon_config(1), **lat, balance=True, gluon=True)
    assert g.gluon and g.grid == (1, 8, 2) and g.partials_shape == (8, 8, 2, 512)
    assert plan(gluon_config(1), **lat, gluon=True).grid == (1, 8, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ragged_batch_splits_and_output(dev, dtype):
    q, k, v, bt, sl = make_case(dev, batch=len(EDGES), hq=4, hk=2, dk=32, pages=10,
                                lens=EDGES, dtype=dtype, seed=3)
    scale = 32 ** -0.5
    if dtype == torch.float32:
        ranges = check_ranges(cfg(2, block_n=16), q, k, v, bt, sl, scale, 4)
        # the longest request (150 tokens, the mean 57) takes every split of the grid
        assert all(s < e for s, e in ranges[-1]) and ranges[-1][0] == (0, 48)
        assert sum(s < e for s, e in ranges[0]) == 1
    out = launch_decode_attention(cfg(2, block_n=16), q, k, v, bt, sl, scale=scale)
    ref = reference_decode_attention(q, k, v, bt, sl, scale=scale)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype][0], rtol=TOL[dtype][1])
    again = launch_decode_attention(cfg(2, block_n=16), q, k, v, bt, sl, scale=scale)
    assert torch.equal(out, again)  # the balanced grid is bit-stable run to run


def test_uniform_lengths_give_the_per_request_bits(dev):
    q, k, v, bt, sl = make_case(dev, batch=4, hq=8, hk=2, dk=64, pages=6, lens=[70] * 4)
    c = cfg(3, block_n=16)
    assert planned_launches(c, q, k, v, bt, sl, scale=0.125)[0].grid[2] == 6
    balanced = launch_decode_attention(c, q, k, v, bt, sl, scale=0.125)
    own = launch_decode_attention(c, q, k, v, bt, sl, scale=0.125, batch_invariant=True)
    assert torch.equal(balanced, own)


def test_batch_invariant_keeps_each_requests_own_splits(dev):
    q, k, v, bt, sl = make_case(dev, batch=len(EDGES), hq=4, hk=2, dk=32, pages=10,
                                lens=EDGES, seed=5)
    c = cfg(2, block_n=16)
    check_ranges(c, q, k, v, bt, sl, 0.2, 2, batch_invariant=True)
    full = launch_decode_attention(c, q, k, v, bt, sl, scale=0.2, batch_invariant=True)
    for b in (0, 3, 7):  # each request alone gives its bits in the batch
        one = launch_decode_attention(c, q[b:b + 1], k, v, bt[b:b + 1], sl[b:b + 1],
                                      scale=0.2, batch_invariant=True)
        assert torch.equal(one[0], full[b])


def test_latent_merge_with_an_empty_request(dev):
    lens = [0, 1, 17, 64, 150, 33]
    q, k, v, bt, sl = make_case(dev, batch=len(lens), hq=4, hk=1, dk=576, dv=512, pages=10,
                                dtype=torch.bfloat16, latent=True, lens=lens, seed=11)
    scale = 576 ** -0.5
    c = cfg(2, block_n=16, merge=True)
    todo = planned_launches(c, q, k, v, bt, sl, scale=scale)
    assert len(todo) == 1 and todo[0].grid[2] == 4  # merged in stage 1 over 4 grid splits
    out = launch_decode_attention(c, q, k, v, bt, sl, scale=scale)
    ref = reference_decode_attention(q, k, v, bt, sl, scale=scale)
    assert torch.equal(out[0].float(), torch.zeros_like(ref[0]))
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    plain = launch_decode_attention(cfg(2, block_n=16), q, k, v, bt, sl, scale=scale)
    torch.testing.assert_close(plain.float(), ref, atol=2e-2, rtol=2e-2)


def test_window_and_multitoken_on_a_balanced_grid(dev):
    lens = [3, 16, 17, 65, 140, 96]
    q3, k, v, bt, sl = make_case(dev, batch=len(lens), hq=4, hk=2, dk=32, pages=10,
                                 lens=lens, seed=13)
    q = torch.randn(len(lens), 2, 4, 32, generator=torch.Generator().manual_seed(2)).to(q3)
    for window in (None, 40):
        c = cfg(2, block_n=16)
        todo = planned_launches(c, q, k, v, bt, sl, scale=0.2, sliding_window=window)
        assert todo[0].grid[2] == 4
        out = launch_decode_attention(c, q, k, v, bt, sl, scale=0.2, sliding_window=window)
        ref = reference_decode_attention(q, k, v, bt, sl, scale=0.2, sliding_window=window)
        torch.testing.assert_close(out.float(), ref, atol=2e-4, rtol=2e-4)


def test_mirror_spreads_work_evenly():
    """What the rule is for, on 64 lengths N(4096, 2048) in a 8,192-token table at 4
    splits: the longest program holds the mean over the split count (one tile up), about
    half what a per-request grid gives the longest request, while the busy programs stay
    within one per request of the config's 4 per request."""
    g = torch.Generator().manual_seed(0)
    lens = (torch.randn(64, generator=g) * 2048 + 4096).clamp(1, 8192).int().tolist()
    balanced = mirror(lens, 4, 8, 64, 8192)
    floor = -(-(-(-sum(lens) // 64) // 4) // 64) * 64
    busy = [e - s for req in balanced for s, e in req if s < e]
    assert max(busy) == max(floor, 1024) and len(busy) <= 64 * 5
    assert sum(busy) == sum(lens)
    own = [e - s for req in mirror(lens, 4, 4, 64, 8192) for s, e in req if s < e]
    assert max(own) == 2048 and max(busy) <= 0.55 * max(own)
