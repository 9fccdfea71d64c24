"""The device-side work plan of the Gluon MLA stage 1 (a config's ``plan=True``).

A split count sized from the block-table width leaves the programs of short requests idle
while long ones run: a batch of ragged lengths needs its work cut by the lengths, which
only the device knows when a CUDA graph replays. :func:`_work_plan` (one program, launched
ahead of stage 1 and captured with it) reads ``seq_lens`` and cuts the batch's 64-token
tiles into *items* of about ``chunk = ceil(total tiles / PARTS)`` tiles: request ``b`` of
``t_b`` tiles gets ``k_b = max(1, round(t_b / chunk))`` items of equal size (within a
tile; an item is at most 1.5 chunks), so the items number at most ``PARTS + batch`` (the
grid the host sizes from shapes alone) and each costs about the same. Rounding, not
ceiling: a batch at full context gets the split grid's own cut (b32 x 256 tiles at 66
parts: 2 items of 128 tiles, one wave; a ceiling would give 3 of 86, a wave and a half). Stage 1 runs one program per item (and row block); the
reduce merges request ``b``'s ``k_b`` partials. Host choices stay constexprs: ``PARTS``
comes from the config's split count and the SM count.

The plan buffer (int32): ``ITEMS`` rows of ``(request, start token, end token)`` (request
``-1``: an unused item, whose program leaves at once), then ``batch`` rows of
``(first item, items)``. An empty request has no item; its reduce writes zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.launching import KernelLaunch

#: tokens of a plan tile (the Gluon stage 1's tile)
PLAN_TILE = 64


@triton.jit
def _work_plan(SL, WP, batch, max_len, stride_sl, PARTS: tl.constexpr, ITEMS: tl.constexpr,
               TILE: tl.constexpr, BLOCK_B: tl.constexpr):
    req = WP + ITEMS * 3
    total = tl.sum(tl.zeros([BLOCK_B], tl.int32), 0)
    for b0 in range(0, batch, BLOCK_B):
        offs = b0 + tl.arange(0, BLOCK_B)
        n = tl.load(SL + offs * stride_sl, mask=offs < batch, other=0)
        total += tl.sum(tl.cdiv(tl.minimum(tl.maximum(n, 0), max_len), TILE), 0)
    chunk = tl.maximum(tl.cdiv(total, PARTS), 1)
    base = total * 0
    for b0 in range(0, batch, BLOCK_B):
        offs = b0 + tl.arange(0, BLOCK_B)
        valid = offs < batch
        n = tl.minimum(tl.maximum(tl.load(SL + offs * stride_sl, mask=valid, other=0), 0),
                       max_len)
        t = tl.cdiv(n, TILE)
        k = tl.where(t > 0, tl.maximum((2 * t + chunk) // (2 * chunk), 1), 0)
        first = base + tl.cumsum(k, 0) - k
        tl.store(req + offs * 2, first, mask=valid)
        tl.store(req + offs * 2 + 1, k, mask=valid)
        kd = tl.maximum(k, 1).to(tl.int64)
        t64 = t.to(tl.int64)
        for j in range(0, tl.max(k, 0)):
            m = valid & (j < k)
            item = WP + (first + j) * 3
            tl.store(item, offs, mask=m)
            tl.store(item + 1, ((j * t64 // kd) * TILE).to(tl.int32), mask=m)
            end = tl.minimum(((j + 1) * t64 // kd) * TILE, n.to(tl.int64))
            tl.store(item + 2, end.to(tl.int32), mask=m)
        base += tl.sum(k, 0)
    for i0 in range(0, ITEMS, BLOCK_B):
        offs = i0 + tl.arange(0, BLOCK_B)
        tl.store(WP + offs * 3, offs * 0 - 1, mask=(offs >= base) & (offs < ITEMS))


def plan_parts(splits: int, cu_count: int, row_blocks: int) -> int:
    """The plan's target count of items per row block: ``splits`` per SM share (an SM's
    share of one row block's work: ``cu_count / row_blocks`` SMs serve a row block)."""
    return max(1, splits * max(1, cu_count // max(1, row_blocks)))


def plan_items(parts: int, batch: int) -> int:
    """The item capacity (stage 1's grid): each request adds at most one item to
    ``parts`` (its last, partial chunk)."""
    return parts + batch


def plan_buffer(seq_lens: torch.Tensor, items: int) -> torch.Tensor:
    """A fresh int32 plan buffer: ``items`` item rows, then a row per request."""
    return torch.empty(items * 3 + seq_lens.shape[0] * 2, dtype=torch.int32,
                       device=seq_lens.device)


def plan_launch(seq_lens: torch.Tensor, wp: torch.Tensor, max_len: int, parts: int,
                items: int) -> KernelLaunch:
    """The plan kernel's launch into ``wp`` (:func:`plan_buffer`) for lengths clamped to
    ``[0, max_len]``."""
    batch = seq_lens.shape[0]
    block_b = min(1024, max(16, triton.next_power_of_2(batch)))
    return KernelLaunch(_work_plan, (1,), (seq_lens, wp, batch, max_len, seq_lens.stride(0)),
                        {"PARTS": parts, "ITEMS": items, "TILE": PLAN_TILE,
                         "BLOCK_B": block_b}, {"num_warps": 4})


def reference_plan(lengths: list[int], max_len: int, parts: int,
                   items: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The plan of :func:`_work_plan` in Python (for tests): the item rows and the
    per-request rows."""
    n = [min(max(x, 0), max_len) for x in lengths]
    t = [-(-x // PLAN_TILE) for x in n]
    chunk = max(-(-sum(t) // parts), 1)
    rows: list[tuple[int, int, int]] = []
    reqs = []
    for b, (tb, nb) in enumerate(zip(t, n)):
        k = max(1, (2 * tb + chunk) // (2 * chunk)) if tb else 0
        reqs.append((len(rows), k))
        for j in range(k):
            rows.append((b, j * tb // k * PLAN_TILE, min((j + 1) * tb // k * PLAN_TILE, nb)))
    rows += [(-1, 0, 0)] * (items - len(rows))
    return rows, reqs
