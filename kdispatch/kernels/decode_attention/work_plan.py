"""The device-side work plan of the Gluon MLA stage 1 (a config's ``plan=True``).

A split count sized from the block-table width leaves the programs of short requests idle
while long ones run: a batch of ragged lengths needs its work cut by the lengths, which
only the device knows when a CUDA graph replays. :func:`_work_plan` (one program, launched
ahead of stage 1 and captured with it) reads ``seq_lens`` and lays the batch's 64-token
tiles end to end (request after request, ``T`` tiles in all, ``R`` nonempty requests) with a
gap of ``SEG_COST`` tiles between consecutive requests, then cuts that line of
``V = T + (R - 1) SEG_COST`` into ``P = min(PARTS, T)`` equal parts: part ``p`` covers
``[p V // P, (p + 1) V // P)`` (parts past ``P`` none). Stage 1 runs one persistent
program per part (and row block; a grid of ``PARTS`` that the host sizes from shapes
alone, one program per SM), which walks its part's *segments* (the pieces of the requests
its range covers, in order). A segment costs its tiles plus a fixed start and end (the
first tile's copy, the pipeline's fill and drain, the partials' store: ~12 us, about 5
tiles at 128 heads, measured program by program in docs/decode_notes.md v29), and a part
pays one such cost for each request that starts inside it: the gaps charge it, so the
programs of one wave finish together to within about a segment's cost, however ragged
the lengths (a gap cut by a part boundary charges a cost no segment pays).
A segment is one partial of its request; the reduce merges a request's partials.

Slots: the segment of part ``p`` and the request of nonempty rank ``r`` (empty requests
have no tiles and no rank) has partial slot ``p + r``: along the line both never decrease
and one grows at each segment, so slots are unique, below ``PARTS + batch``, and a part's
segments (a request's partials) take consecutive slots.

The plan buffer (int32): ``ITEMS`` slot rows of ``(request, start token, end token)``
(a slot no segment takes is never read), then ``batch`` rows of ``(first slot, slots)``
(``(0, 0)`` for an empty request: its reduce writes zeros), then ``PARTS`` rows of
``(first slot, last slot)`` (``(0, -1)`` for a part with no tile: fewer tiles than parts,
or a part within a gap). One program writes it: every part row as empty, then two passes
over the batch, each row by one thread (a part's row by the segments that start and end
its range).
Host choices stay constexprs: ``PARTS`` comes from the config's split count and the SM
count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.decode_attention.gluon_mla_tiles import BLOCK_H, BLOCK_N
from kdispatch.launching import KernelLaunch

#: tokens of a plan tile (the Gluon stage 1's tile)
PLAN_TILE = BLOCK_N
#: parts the plan kernel marks empty at once
_BLOCK_P = 128
#: a segment's fixed cost in plan tiles (the gap between requests on the plan's line)
SEG_COST = 5


@triton.jit
def _tiles(SL, offs, batch, max_len, stride_sl, TILE: tl.constexpr):
    """(clamped lengths, tiles) of requests ``offs`` (zero past the batch)."""
    n = tl.load(SL + offs * stride_sl, mask=offs < batch, other=0)
    n = tl.minimum(tl.maximum(n, 0), max_len)
    return n, tl.cdiv(n, TILE)


@triton.jit
def _work_plan(SL, WP, batch, max_len, stride_sl, PARTS: tl.constexpr, ITEMS: tl.constexpr,
               TILE: tl.constexpr, SEG: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_P: tl.constexpr):
    req = WP + ITEMS * 3
    part_rows = req + batch * 2
    # every part empty (0, -1) first: a part within a gap, or past the tiles, has no segment
    for p0 in range(0, PARTS, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        tl.store(part_rows + offs_p * 2, offs_p * 0, mask=offs_p < PARTS)
        tl.store(part_rows + offs_p * 2 + 1, offs_p * 0 - 1, mask=offs_p < PARTS)
    tl.debug_barrier()  # (the segments' stores below overwrite these)
    total = tl.sum(tl.zeros([BLOCK_B], tl.int64), 0)
    reqs = total
    for b0 in range(0, batch, BLOCK_B):
        t = _tiles(SL, b0 + tl.arange(0, BLOCK_B), batch, max_len, stride_sl, TILE)[1]
        total += tl.sum(t.to(tl.int64), 0)
        reqs += tl.sum((t > 0).to(tl.int64), 0)
    line = tl.maximum(total + tl.maximum(reqs - 1, 0) * SEG, 1)
    # parts with tiles: all, or one a tile when the batch has fewer (the rest empty, after
    # every request: no request's slots skip one)
    pn = tl.maximum(tl.minimum(total, PARTS), 1)
    # the requests: each one's parts (the part of line position x: ((x + 1) P - 1) // V),
    # its slots, its segments; a segment that starts a part's range is its first (its slot
    # the part's first), one that ends it its last: each part row written once, by one
    # segment
    base = total * 0  # tiles before this block
    rank0 = base.to(tl.int32)  # nonempty requests before this block
    for b0 in range(0, batch, BLOCK_B):
        offs = b0 + tl.arange(0, BLOCK_B)
        valid = offs < batch
        n, t = _tiles(SL, offs, batch, max_len, stride_sl, TILE)
        t64 = t.to(tl.int64)
        live = t > 0
        r = rank0 + tl.cumsum(live.to(tl.int32), 0) - live.to(tl.int32)
        # the request's first tile on the line: the tiles and gaps before it
        c0 = base + tl.cumsum(t64, 0) - t64 + r.to(tl.int64) * SEG
        p_first = ((c0 + 1) * pn - 1) // line
        p_last = ((c0 + t64) * pn - 1) // line
        k = tl.where(live, p_last - p_first + 1, 0).to(tl.int32)
        tl.store(req + offs * 2, tl.where(live, p_first.to(tl.int32) + r, 0), mask=valid)
        tl.store(req + offs * 2 + 1, k, mask=valid)
        for j in range(0, tl.max(k, 0)):
            m = valid & (j < k)
            p = p_first + j
            ps = p * line // pn
            pe = (p + 1) * line // pn
            lo = tl.maximum(ps, c0)
            hi = tl.minimum(pe, c0 + t64)
            slot_i = p.to(tl.int32) + r
            slot = WP + slot_i * 3
            tl.store(slot, offs, mask=m)
            tl.store(slot + 1, ((lo - c0) * TILE).to(tl.int32), mask=m)
            end = tl.minimum((hi - c0) * TILE, n.to(tl.int64))
            tl.store(slot + 2, end.to(tl.int32), mask=m)
            # first in its part: the request before ends (a gap before this one) by the
            # part's start; last: the next one starts (a gap after) at or past its end
            tl.store(part_rows + p * 2, slot_i, mask=m & (c0 - SEG <= ps))
            tl.store(part_rows + p * 2 + 1, slot_i, mask=m & (c0 + t64 + SEG >= pe))
        base += tl.sum(t64, 0)
        rank0 += tl.sum(live.to(tl.int32), 0)


def plan_parts(splits: int, cu_count: int, rows: int) -> int:
    """The plan's parts for ``rows`` (token, head) rows a request: ``splits`` persistent
    programs per SM share (an SM's share of one row block's work: ``cu_count /
    row_blocks`` SMs serve one of the ``cdiv(rows, BLOCK_H)`` row blocks)."""
    row_blocks = max(1, -(-rows // BLOCK_H))
    return max(1, splits * max(1, cu_count // row_blocks))


def plan_items(parts: int, batch: int) -> int:
    """The slot capacity (the partials' slots): segments number at most
    ``parts + batch - 1``."""
    return parts + batch


def plan_buffer(seq_lens: torch.Tensor, items: int, parts: int) -> torch.Tensor:
    """A fresh int32 plan buffer: ``items`` slot rows, a row per request, a row per part."""
    return torch.empty(items * 3 + (seq_lens.shape[0] + parts) * 2, dtype=torch.int32,
                       device=seq_lens.device)


def plan_views(wp: torch.Tensor, items: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-request rows ``[batch, 2]``, per-part rows) of a plan buffer."""
    req = wp[items * 3:items * 3 + batch * 2].view(-1, 2)
    return req, wp[items * 3 + batch * 2:]


def plan_launch(seq_lens: torch.Tensor, wp: torch.Tensor, max_len: int, parts: int,
                items: int, seg: int = SEG_COST) -> KernelLaunch:
    """The plan kernel's launch into ``wp`` (:func:`plan_buffer`) for lengths clamped to
    ``[0, max_len]``, ``seg`` tiles a segment's cost (0: parts of equal tiles)."""
    batch = seq_lens.shape[0]
    block_b = min(256, max(16, triton.next_power_of_2(batch)))
    return KernelLaunch(_work_plan, (1,), (seq_lens, wp, batch, max_len, seq_lens.stride(0)),
                        {"PARTS": parts, "ITEMS": items, "TILE": PLAN_TILE, "SEG": seg,
                         "BLOCK_B": block_b, "BLOCK_P": _BLOCK_P}, {"num_warps": 4})


def reference_plan(lengths: list[int], max_len: int, parts: int,
                   seg: int = SEG_COST) -> tuple[dict[int, tuple[int, int, int]],
                                                 list[tuple[int, int]], list[tuple[int, int]]]:
    """The plan of :func:`_work_plan` in Python (for tests): the used slot rows by slot,
    the per-request rows and the per-part rows (first and last slot)."""
    n = [min(max(x, 0), max_len) for x in lengths]
    t = [-(-x // PLAN_TILE) for x in n]
    total = sum(t)
    live = sum(1 for x in t if x)
    line = max(1, total + max(live - 1, 0) * seg)
    pn = max(1, min(parts, total))
    bounds = [p * line // pn for p in range(pn + 1)] + [line] * (parts - pn)
    slots: dict[int, tuple[int, int, int]] = {}
    reqs: list[tuple[int, int]] = []
    segs: list[list[int]] = [[] for _ in range(parts)]
    c0, r = 0, 0
    for b, (tb, nb) in enumerate(zip(t, n)):
        mine = ([p for p in range(parts) if bounds[p] < c0 + tb and bounds[p + 1] > c0]
                if tb else [])
        reqs.append((mine[0] + r, len(mine)) if tb else (0, 0))
        for p in mine:
            lo, hi = max(bounds[p], c0), min(bounds[p + 1], c0 + tb)
            slots[p + r] = (b, (lo - c0) * PLAN_TILE, min((hi - c0) * PLAN_TILE, nb))
            segs[p].append(p + r)
        if tb:
            c0 += tb + seg
            r += 1
    part_rows = [(s[0], s[-1]) if s else (0, -1) for s in segs]
    return slots, reqs, part_rows
