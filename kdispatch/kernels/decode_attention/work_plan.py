"""The device-side work plan of the Gluon MLA stage 1 (a config's ``plan=True``).

A split count sized from the block-table width leaves the programs of short requests idle
while long ones run: a batch of ragged lengths needs its work cut by the lengths, which
only the device knows when a CUDA graph replays. :func:`_work_plan` (one program, launched
ahead of stage 1 and captured with it) reads ``seq_lens`` and lays the batch's 64-token
tiles end to end (request after request, ``T`` tiles in all), then cuts that line into
``P = min(PARTS, T)`` equal parts: part ``p`` holds tiles ``[p T // P, (p + 1) T // P)``
(parts past ``P`` none). Stage 1 runs one persistent program per part (and row block; a
grid of ``PARTS`` that the host sizes from shapes alone, one program per SM), which walks
its part's *segments* (the pieces of the requests its range covers, in order), so every
program does the same work to within a tile and the programs of one wave finish together,
however ragged the lengths.
A segment is one partial of its request; the reduce merges a request's partials.

Slots: the segment of part ``p`` and the request of nonempty rank ``r`` (empty requests
have no tiles and no rank) has partial slot ``p + r``: along the line both never decrease
and one grows at each segment, so slots are unique, below ``PARTS + batch``, and a part's
segments (a request's partials) take consecutive slots.

The plan buffer (int32): ``ITEMS`` slot rows of ``(request, start token, end token)``
(a slot no segment takes is never read), then ``batch`` rows of ``(first slot, slots)``
(``(0, 0)`` for an empty request: its reduce writes zeros), then ``PARTS`` rows of
``(first slot, last slot)`` (``(0, -1)`` for a part with no tile: fewer tiles than
parts). One program writes it in two passes over the batch, each row by one thread (a
part's row by the segments that start and end its range).
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


@triton.jit
def _tiles(SL, offs, batch, max_len, stride_sl, TILE: tl.constexpr):
    """(clamped lengths, tiles) of requests ``offs`` (zero past the batch)."""
    n = tl.load(SL + offs * stride_sl, mask=offs < batch, other=0)
    n = tl.minimum(tl.maximum(n, 0), max_len)
    return n, tl.cdiv(n, TILE)


@triton.jit
def _work_plan(SL, WP, batch, max_len, stride_sl, PARTS: tl.constexpr, ITEMS: tl.constexpr,
               TILE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr):
    req = WP + ITEMS * 3
    part_rows = req + batch * 2
    total = tl.sum(tl.zeros([BLOCK_B], tl.int64), 0)
    for b0 in range(0, batch, BLOCK_B):
        total += tl.sum(_tiles(SL, b0 + tl.arange(0, BLOCK_B), batch, max_len, stride_sl,
                               TILE)[1].to(tl.int64), 0)
    t_div = tl.maximum(total, 1)
    # parts with tiles: all, or one a tile when the batch has fewer (the rest empty, after
    # every request: no request's slots skip one)
    pn = tl.minimum(total, PARTS)
    pn = tl.maximum(pn, 1)
    # the requests: each one's parts (the part of tile x: ((x + 1) P - 1) // T), its slots,
    # its segments; a segment that starts a part's range is its first (its slot the part's
    # first), one that ends it its last: each part row written once, by one segment
    base = total * 0  # tiles before this block
    rank0 = base.to(tl.int32)  # nonempty requests before this block
    for b0 in range(0, batch, BLOCK_B):
        offs = b0 + tl.arange(0, BLOCK_B)
        valid = offs < batch
        n, t = _tiles(SL, offs, batch, max_len, stride_sl, TILE)
        t64 = t.to(tl.int64)
        live = t > 0
        c0 = base + tl.cumsum(t64, 0) - t64
        r = rank0 + tl.cumsum(live.to(tl.int32), 0) - live.to(tl.int32)
        p_first = ((c0 + 1) * pn - 1) // t_div
        p_last = ((c0 + t64) * pn - 1) // t_div
        k = tl.where(live, p_last - p_first + 1, 0).to(tl.int32)
        tl.store(req + offs * 2, tl.where(live, p_first.to(tl.int32) + r, 0), mask=valid)
        tl.store(req + offs * 2 + 1, k, mask=valid)
        for j in range(0, tl.max(k, 0)):
            m = valid & (j < k)
            p = p_first + j
            ps = p * total // pn
            pe = (p + 1) * total // pn
            lo = tl.maximum(ps, c0)
            hi = tl.minimum(pe, c0 + t64)
            slot_i = p.to(tl.int32) + r
            slot = WP + slot_i * 3
            tl.store(slot, offs, mask=m)
            tl.store(slot + 1, ((lo - c0) * TILE).to(tl.int32), mask=m)
            end = tl.minimum((hi - c0) * TILE, n.to(tl.int64))
            tl.store(slot + 2, end.to(tl.int32), mask=m)
            tl.store(part_rows + p * 2, slot_i, mask=m & (c0 <= ps))
            tl.store(part_rows + p * 2 + 1, slot_i, mask=m & (c0 + t64 >= pe))
        base += tl.sum(t64, 0)
        rank0 += tl.sum(live.to(tl.int32), 0)
    # parts without tiles: (0, -1), no segment
    for p0 in range(0, PARTS, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        none = (offs_p < PARTS) & ((offs_p >= pn) | (total == 0))
        tl.store(part_rows + offs_p * 2, offs_p * 0, mask=none)
        tl.store(part_rows + offs_p * 2 + 1, offs_p * 0 - 1, mask=none)


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
                items: int) -> KernelLaunch:
    """The plan kernel's launch into ``wp`` (:func:`plan_buffer`) for lengths clamped to
    ``[0, max_len]``."""
    batch = seq_lens.shape[0]
    block_b = min(256, max(16, triton.next_power_of_2(batch)))
    return KernelLaunch(_work_plan, (1,), (seq_lens, wp, batch, max_len, seq_lens.stride(0)),
                        {"PARTS": parts, "ITEMS": items, "TILE": PLAN_TILE,
                         "BLOCK_B": block_b, "BLOCK_P": _BLOCK_P}, {"num_warps": 4})


def reference_plan(lengths: list[int], max_len: int, parts: int) -> tuple[
        dict[int, tuple[int, int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """The plan of :func:`_work_plan` in Python (for tests): the used slot rows by slot,
    the per-request rows and the per-part rows (first and last slot)."""
    n = [min(max(x, 0), max_len) for x in lengths]
    t = [-(-x // PLAN_TILE) for x in n]
    total = sum(t)
    pn = max(1, min(parts, total))
    bounds = [p * total // pn for p in range(pn + 1)] + [total] * (parts - pn)
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
        c0 += tb
        r += 1 if tb else 0
    part_rows = [(s[0], s[-1]) if s else (0, -1) for s in segs]
    return slots, reqs, part_rows
