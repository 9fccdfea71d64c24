"""The device-side work plan of the Gluon MLA stage 1 (work_plan.py) on the CPU: the plan
kernel against its Python statement on ragged lengths (empty, around page and tile
boundaries, past the table, negative, more requests than one block), the items' invariants,
the reduce merging a plan's item partials, and the launch plan and config rules."""

from __future__ import annotations

import random

import pytest
import torch

from kdispatch.kernels.decode_attention import spec
from kdispatch.kernels.decode_attention.kernels import _decode_reduce
from kdispatch.kernels.decode_attention.launch import launches, plan
from kdispatch.kernels.decode_attention.work_plan import (PLAN_TILE, SEG_COST, plan_buffer,
                                                          plan_items, plan_launch, plan_parts,
                                                          plan_views, reference_plan)

MAX_LEN = 4096


def _run_plan(lengths, parts, max_len=MAX_LEN, seg=SEG_COST):
    """(used slot rows by slot, per-request rows, per-part rows) the plan kernel wrote."""
    sl = torch.tensor(lengths, dtype=torch.int32)
    items = plan_items(parts, len(lengths))
    wp = plan_buffer(sl, items, parts).fill_(-7)  # every row the kernel must write is garbage
    plan_launch(sl, wp, max_len, parts, items, seg).run()
    req, part_rows = plan_views(wp, items, len(lengths))
    reqs = [tuple(r) for r in req.tolist()]
    parts_ = [tuple(r) for r in part_rows.view(-1, 2).tolist()]
    slots = wp[:items * 3].view(-1, 3).tolist()
    used = {s for first, last in parts_ for s in range(first, last + 1)}
    return {s: tuple(slots[s]) for s in sorted(used)}, reqs, parts_


CASES = [([1, 15, 16, 17, 63, 64, 65, 0, 127, 128, 129, 4096], 8),
         ([4096] * 4, 3),
         ([0, 0, 0], 5),
         ([64 * 7 + 1, 1], 5),
         ([5000, -3, 100, 2 ** 30], 6),  # past the table and negative: clamped
         ([1], 1),
         ([1, 65], 7),  # fewer tiles than parts: empty parts
         ([0, 64, 0, 0, 64, 0], 2)]  # empty requests around a part boundary


@pytest.mark.parametrize("lengths, parts", CASES)
@pytest.mark.parametrize("seg", [SEG_COST, 0, 300])
def test_the_plan_kernel_is_its_python_statement(lengths, parts, seg):
    assert _run_plan(lengths, parts, seg=seg) == reference_plan(lengths, MAX_LEN, parts, seg)


def test_more_requests_than_one_block_and_random_batches():
    rnd = random.Random(3)
    for batch, parts in ((1100, 64), (37, 16), (200, 132), (300, 17)):
        lengths = [rnd.choice([0, 1, 63, 64, 65, rnd.randint(0, 3000)]) for _ in range(batch)]
        assert _run_plan(lengths, parts) == reference_plan(lengths, MAX_LEN, parts)


def _part_costs(lengths, parts, seg):
    """Each part's (first, last) slot, tiles, segments and line range (the tiles laid end
    to end with ``seg`` tiles between requests), checked for what every plan holds: a
    part's segments take consecutive slots in request order; each request's segments take
    consecutive slots of consecutive parts, start at 0, meet on tile boundaries and end at
    its clamped length; empty requests have none."""
    slots, reqs, part_rows = _run_plan(lengths, parts, seg=seg)
    n = [min(max(x, 0), MAX_LEN) for x in lengths]
    tiles = [-(-x // PLAN_TILE) for x in n]
    total, live = sum(tiles), sum(1 for t in tiles if t)
    line, pn = max(1, total + max(live - 1, 0) * seg), max(1, min(parts, total))
    assert all(s < parts + len(lengths) for s in slots)
    owner, out = {}, []
    for p, (first, last) in enumerate(part_rows):
        k = last - first + 1
        mine = [slots[s] for s in range(first, first + k)]
        size = sum(-(-(e - s) // PLAN_TILE) for _, s, e in mine)
        assert [b for b, _, _ in mine] == sorted({b for b, _, _ in mine})
        owner.update({s: p for s in range(first, first + k)})
        rng = (p + 1) * line // pn - p * line // pn if p < pn else 0
        out.append((k, size, rng))
    assert sum(last - first + 1 for first, last in part_rows) == len(slots)
    for b, (first, k) in enumerate(reqs):
        assert (k == 0) == (n[b] == 0)
        mine = [slots[s] for s in range(first, first + k)]
        assert all(r[0] == b for r in mine)
        if not k:
            continue
        assert mine[0][1] == 0 and mine[-1][2] == n[b]
        for (_, s0, e0), (_, s1, e1) in zip(mine, mine[1:]):
            assert e0 == s1 and s1 % PLAN_TILE == 0 and e1 > s1
        assert [owner[s] for s in range(first, first + k)] == list(
            range(owner[first], owner[first] + k))
    return out


MIXED = CASES + [([4096] * 3 + [1] * 40 + [2000], 9), ([1] * 30 + [4096] * 2, 12)]


@pytest.mark.parametrize("lengths, parts", MIXED)
def test_parts_cost_the_same_and_segments_tile_each_request(lengths, parts):
    """A part's cost, its tiles plus ``SEG_COST`` for each segment after its first, is its
    share of the line to within the two gaps at its ends (at most ``2 SEG_COST`` less);
    a part with no segment lies within a gap (or past the batch's tiles)."""
    for k, size, rng in _part_costs(lengths, parts, SEG_COST):
        if k:
            assert rng - 2 * SEG_COST <= size + SEG_COST * (k - 1) <= rng
        else:
            assert rng <= SEG_COST and size == 0


@pytest.mark.parametrize("lengths, parts", MIXED)
def test_without_a_segment_cost_parts_hold_equal_tiles(lengths, parts):
    """``seg=0``: each part holds ``T // parts`` or one more tile of the batch's ``T``."""
    total = sum(-(-min(max(x, 0), MAX_LEN) // PLAN_TILE) for x in lengths)
    for k, size, _ in _part_costs(lengths, parts, 0):
        assert size in (total // parts, total // parts + 1) or (size == 0 and k == 0)


def test_a_part_pays_for_each_request_it_starts():
    """32 requests of 256 tiles at 66 parts (128 heads on 132 SMs): a part holding two
    segments (a request's end and the next one's start) has ``SEG_COST`` fewer tiles than
    its share, one holding a single segment at most its share; the parts' costs differ by
    at most ``SEG_COST`` (a gap cut by a part's end is charged for no segment). Without
    the cost, 64 parts are halves of requests."""
    slots, reqs, part_rows = _run_plan([256 * PLAN_TILE] * 32, 66, max_len=256 * PLAN_TILE)
    line = 32 * 256 + 31 * SEG_COST
    costs, two = [], 0
    for p, (first, last) in enumerate(part_rows):
        k = last - first + 1
        size = sum(slots[s][2] - slots[s][1] for s in range(first, last + 1)) // PLAN_TILE
        rng = (p + 1) * line // 66 - p * line // 66
        assert k in (1, 2) and (size <= rng - SEG_COST if k == 2 else size <= rng)
        two += k == 2
        costs.append(size + SEG_COST * (k - 1))
    assert two >= 25 and max(costs) - min(costs) <= SEG_COST
    slots, reqs, part_rows = _run_plan([256 * PLAN_TILE] * 32, 64, max_len=256 * PLAN_TILE,
                                       seg=0)
    assert {k for _, k in reqs} == {2} and all(f == last for f, last in part_rows)
    assert {e - s for _, s, e in slots.values()} == {128 * PLAN_TILE}


def test_the_reduce_merges_a_plans_item_partials():
    """Request ``b``'s partials sit in its items' slots; the reduce (``PLAN``) merges
    exactly those, in log2 space, and writes zeros for a request without items."""
    g = torch.Generator().manual_seed(0)
    rows, dv, items = 4, 32, 9
    reqs = torch.tensor([[0, 3], [3, 0], [3, 1], [4, 5]], dtype=torch.int32)
    po = torch.randn(1, rows, items, dv, generator=g)
    pl = torch.randn(1, rows, items, generator=g) * 3
    out = torch.empty(len(reqs), rows, dv)
    _decode_reduce[(rows, 1, len(reqs))](
        reqs, po, pl, out, 0, 0, 2, 0, items * dv, dv, 0, items, rows * dv, 0, dv,
        DV=dv, BLOCK_DV=dv, BLOCK_N=64, NUM_KV_SPLITS=1, SPLITS_P2=16, SPLIT_CHUNK=8,
        SLIDING=False, USE_PDL=False, QLEN=1, GRID_SPLITS=1, PLAN=True)
    for b, (first, k) in enumerate(reqs.tolist()):
        if k == 0:
            assert out[b].abs().max() == 0
            continue
        w = torch.softmax(pl[0, :, first:first + k] * torch.log(torch.tensor(2.0)), -1)
        want = (w[..., None] * po[0, :, first:first + k]).sum(1)
        torch.testing.assert_close(out[b], want, atol=1e-5, rtol=1e-5)


def test_a_planned_gluon_launch_is_plan_then_stage_1_then_reduce():
    """Grid ``(row blocks, parts, 1)`` (a persistent program per part and row block),
    ``parts + batch`` partial slots, the reduce reading the plan's per-request rows; the
    stage 1 gets the plan buffer, its per-part rows and zero batch strides."""
    cfg = spec.gluon_config(2, plan=True)
    b, hq = 3, 128
    p = plan(cfg, b, hq, 576, 64, 1, 512, True, False, False, False, 1, False, False,
             False, True, 4 * 64, True, 132)
    parts = 2 * (132 // 2)
    assert p.plan_parts == parts and p.grid == (2, parts, 1)
    assert p.partials_shape == (1, hq, parts + b, 512) and p.reduce_constexprs["PLAN"]
    assert p.constexprs["PLAN"] and p.reduce_grid == (hq, 1, b)
    q = torch.zeros(b, hq, 576, dtype=torch.bfloat16)
    kv = torch.zeros(20, 64, 1, 576, dtype=torch.bfloat16)
    sl = torch.tensor([5, 200, 0], dtype=torch.int32)
    todo = launches(p, q, kv, kv[..., :512], torch.zeros(b, 4, dtype=torch.int32), sl,
                    torch.empty(b, hq, 512, dtype=torch.bfloat16), 0.1, 0.0, 0)
    assert [t.fn.__name__ for t in todo] == ["_work_plan", "_gluon_mla_stage1",
                                             "_decode_reduce"]
    wp = todo[0].args[1]
    assert todo[0].constexprs["SEG"] == SEG_COST  # the plan charges a segment's cost
    items = parts + b
    assert wp.numel() == items * 3 + (b + parts) * 2
    args = dict(zip(todo[1].fn.arg_names, todo[1].args))
    assert args["WP"] is wp and args["stride_pob"] == 0 and args["stride_plb"] == 0
    assert args["WPP"].data_ptr() == wp.data_ptr() + (items * 3 + b * 2) * 4
    assert args["WPP"].numel() == parts * 2
    req = todo[2].args[0]
    assert req.data_ptr() == wp.data_ptr() + items * 3 * 4 and req.stride() == (2, 1)
    assert req.shape == (b, 2)


def test_plan_parts_serve_every_row_block_once_a_wave():
    """Parts per row block: an SM share per split (128 heads: 2 row blocks, 66 parts
    at 132 SMs; 16 heads x 2 tokens: 1 row block, 132)."""
    assert plan_parts(1, 132, 128) == 66 and plan_parts(2, 132, 128) == 132
    assert plan_parts(1, 132, 32) == 132 and plan_parts(1, 132, 64 * 200) == 1


def test_the_plan_is_a_gluon_option_outside_batch_invariance():
    key = spec.DecodeKey(vendor="nvidia", arch="sm_90", cu_count=132, device="nvidia-h200",
                         dtype="bfloat16", kv_dtype="bfloat16", num_q_heads=128,
                         num_kv_heads=1, head_dim=576, head_dim_v=512, page_size=64,
                         batch=32, context=16384, q_len=1, sliding=False,
                         batch_invariant=False)
    planned = spec.gluon_config(4, plan=True)
    assert spec.is_valid(key, planned) and planned.model_dump()["plan"] is True
    assert "plan" not in spec.gluon_config(4).model_dump()  # digests of old rows stay
    assert not spec.is_valid(key.model_copy(update={"batch_invariant": True}), planned)
    assert not spec.is_valid(key, planned.model_copy(update={"kernel": "triton"}))
    assert not spec.is_valid(key, planned.model_copy(update={"block_h": 32}))
    cands = spec_candidates(key)
    assert {c for c in cands if c.plan} == {spec.gluon_config(s, plan=True)
                                           for s in spec.PLAN_SPLITS}
    assert not any(c.plan for c in spec_candidates(key.model_copy(update={"batch": 1})))


def spec_candidates(key):
    from kdispatch.kernels.decode_attention.tuning import DecodeTuning

    return list(DecodeTuning().candidates(key))
