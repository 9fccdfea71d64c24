"""The Gluon MLA stage 1's seesaw (``gluon_mla``; bf16 latents in 16-, 32- or 64-token
pages): two 4-warp warpgroups, each scoring every other 64-token tile with 64 x 64 score
MMAs (one warpgroup's operand reads per tile where both warpgroups' 32-column halves read
q twice) and holding half of the output's columns, with one warpgroup's softmax under the
other's MMAs.

A stage (one 64-token tile) is copied and released in three parts, each with an ``empty``
mbarrier of its own (count 1, ``empty[3 * stage + part]``): the rope (part 0: the rope
block, read only by the tile's score MMA), the left half (part 1: latent columns 0-255,
V of warpgroup 0's output columns) and the right half (part 2: columns 256-511, V of
warpgroup 1's). Each of the stage's nine 64-column blocks completes a ``ready`` mbarrier
of its own (``ready[9 * stage + block]``: latent blocks 0-7, the rope 8). The copy warp
(:func:`_producer_blocks`) fills a stage right half first, then the rope, then the left
half, each part once its last reader released it, and the score MMA consumes the blocks
in that order (:func:`_seesaw_scores`). Warpgroup 1 runs its PV MMA of tile B with B's P
from its registers (the wgmma's A operand), not from shared memory, so it releases B's
right half and rope as soon as that MMA is done; only warpgroup 0 reads B's P from shared
memory. Per pair (A = tile 2j in stage 0, B = 2j + 1 in stage 1; ``ph = j & 1``)::

    warpgroup 0                          warpgroup 1
    score A (right, rope, left)
    wait; arrive sa_done ------------>   wait sa_done; score B (right, rope, left)
    softmax A (m_a)
    P_A, m_a to shared memory;
    arrive pa_ready ----------------->   wait pa_ready; rescale O; PV A (right half) ...
    PV A (left half); wait               wait score B; softmax B (m_b over m_a)
    arrive pa_done, empty[0], empty[1]   wait PV A; arrive empty[2]; rescale O
                                   ---> wait pa_done; P_B, m_b to shared memory
    wait pb_ready <------------------    arrive pb_ready
    rescale O; PV B (left half); wait    PV B (right half, P_B in registers); wait
    arrive empty[4]                      arrive empty[5], empty[3]

The protocol. Every mbarrier completes once a pair, or once a lap of its stage (``j`` for
both stages: A is a stage 0 lap, B a stage 1 lap); its waiters wait parity ``j & 1``, the
copy warp an empty's ``(j & 1) ^ 1`` (a fresh mbarrier's preceding phase passes: the
first lap copies at once); and none can complete a phase twice ahead of its waiter::

    mbarrier (count)      arrives (after)                        waits (before)
    ready[9 st + c] (1)   copy warp's expect; TMA bytes of        the tile's scorer: its
                          block c (c = 0-7 latent, 8 rope)        score MMA's block c
    empty[0] A rope (1)   wg0, PV MMA of A waited (its score      copy warp, A's rope
                          MMA, the rope's only reader, before)
    empty[1] A left (1)   wg0, PV MMA of A waited                 copy warp, A's left
    empty[2] A right (1)  wg1, PV MMA of A waited                 copy warp, A's right
    empty[3] B rope (1)   wg1, PV MMA of B waited (with B)        copy warp, B's rope
    empty[4] B left (1)   wg0, PV MMA of B waited (with B)        copy warp, B's left
    empty[5] B right (1)  wg1, PV MMA of B waited (with B)        copy warp, B's right
    sa_done (1)           wg0, score MMA of A waited              wg1, score MMA of B
    pa_ready (1)          wg0, P_A and m_a stored                 wg1, m_a, PV MMA of A
    pa_done (1)           wg0, PV MMA of A waited                 wg1, storing P_B (then
                                                                  its PV MMA of B)
    pb_ready (1)          wg1, P_B and m_b stored (every pair)    wg0, m_b, PV MMA of B
    fin_bar (2)           both, row sums stored (phase 0)         both

With a work plan (``PLAN``: a persistent program over its part's segments, work_plan.py)
the table runs on across segments: ``fin_bar`` and ``q_bar`` complete once a segment
(phase: the segment's index), stage 0's mbarriers once a pair (phase: the pairs of the
earlier segments ``laps0`` plus ``j``), stage 1's once a B tile (``laps1``: the B tiles so far;
a segment's odd last pair has none), and ``q_free`` (2: each warpgroup once its last
score MMA of the segment is done) lets the copy warp load the next segment's q. A
segment's odd last pair scores stage 1 unwaited while the copy warp may already fill it
for the next segment: those scores are masked whatever they read.

Points that hold it together:

- **The P buffer needs no "free" mbarrier** (the landed seesaw's ``pb_done``, gone): P_B's
  only reader from shared memory is warpgroup 0's own PV MMA of B, which it waits before
  the next pair, and warpgroup 1 stored P_B before ``pb_ready``, which warpgroup 0 waited
  before reading it. So warpgroup 0 stores the next P_A with no wait (an early
  ``wait(pb_ready, ph ^ 1)`` there would pass at once: that phase was waited last pair, or
  is the fresh mbarrier's preceding one at ``j = 0``). Warpgroup 1 writes P_B only after
  ``pa_done`` (warpgroup 0's PV MMA of A is done with P_A; its own was waited), and the
  row-max slots are ordered the same way (m_a read before ``pb_ready``, m_b read before
  ``pa_done`` of the next pair).
- **Warpgroup 1 stores P_B before it issues its PV MMA of B**, not while it runs: the
  store reads the bf16 registers the MMA takes as its A operand (the conversion to the
  dot-operand layout is a register renaming), and the PTX ISA calls any access to an
  in-flight wgmma's A fragment undefined. (The form that stored P_B under the MMA
  compiled with no wait and no warning and passed the GPU tests, but ran 1.01-1.04x this
  one's time in session 25's A/B: it waited ``pa_done`` with the MMA in flight.)
- **Constant empty indices**: A is always stage 0 and B stage 1 (the copy warp puts tile
  ``i`` in stage ``i % 2`` from ``i = 0``, pairs are tiles ``2j, 2j + 1``), so the
  warpgroups arrive on ``empty[0..2]`` for A and ``empty[3..5]`` for B as constants; the
  stage index of the buffers stays a value the compiler cannot fold (see the loop).
- **Odd tile counts**: the last pair has no B (``has_b`` false): warpgroup 1 scores stage 1
  with its ready waits predicated off (no copy fills it; stale or never written bytes,
  every score masked to -inf, P_B zeros), skips its PV MMA of B and B's releases, still
  stores m_b (= m_a) and P_B and arrives ``pb_ready`` (warpgroup 0 waits it every pair and
  skips its PV MMA of B). A split of one tile is one such pair: every mbarrier completes
  at most phase 0, the empties are waited only by the copy warp at the fresh parity.
- **The partial last tile**: its scorer waits all nine blocks and zeroes its V rows past
  the split's end in shared memory (fenced, behind the warpgroup's barrier) before its
  score MMA; the other warpgroup reads that tile's V only after ``pa_ready`` / ``pb_ready``.
  The blocks' arrival implies the stage's previous readers released every part.
- **The PV MMA of B in flight across no join**: the MMA and its wait sit in one ``if
  has_b`` branch (the P_B exchange before it, on every pair), so no in-flight accumulator
  passes through a branch's merge.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# the tile's geometry. The kernels take it as parameters of these names; the code hash
# (kdispatch/source_hash.py) records the value of any module constant a kernel names, so
# the constants stay visible here as in the one module the H200 table was tuned on
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (  # noqa: F401
    BLOCK_H, BLOCK_N, DV)
from kdispatch.kernels.decode_attention.gluon_mla_tiles import (_free_q, _load_q,
                                                                _masked_scores, _segment,
                                                                _store_partials, _tile_ids,
                                                                _zero_tail)


@gluon.jit
def _score_block(q_smem, kv, ready, st, ph, live, s, c: gl.constexpr):
    mbarrier.wait(ready.index(st * 9 + c), ph, pred=live)
    return warpgroup_mma(q_smem.slice(c * 64, 64, dim=1),
                         kv.slice(c * 64, 64, dim=1).permute((1, 0)), s, is_async=True)


@gluon.jit
def _seesaw_scores(q_smem, qpe_smem, kv, pe, ready, st, ph, live, s_layout: gl.constexpr,
                   BLOCK_H: gl.constexpr, TILE: gl.constexpr):
    """A warpgroup's score MMA of a whole tile (64 rows x ``TILE`` tokens), in flight, each
    64-column block issued once its copy landed, in the copy warp's order: the right half
    (latent blocks 4-7), the rope, the left half (blocks 0-3)."""
    s_zero = gl.zeros([BLOCK_H, TILE], gl.float32, layout=s_layout)
    mbarrier.wait(ready.index(st * 9 + 4), ph, pred=live)
    s = warpgroup_mma(q_smem.slice(256, 64, dim=1), kv.slice(256, 64, dim=1).permute((1, 0)),
                      s_zero, use_acc=False, is_async=True)
    for c in gl.static_range(5, 8):
        s = _score_block(q_smem, kv, ready, st, ph, live, s, c)
    mbarrier.wait(ready.index(st * 9 + 8), ph, pred=live)
    s = warpgroup_mma(qpe_smem, pe.permute((1, 0)), s, is_async=True)
    for c in gl.static_range(0, 4):
        s = _score_block(q_smem, kv, ready, st, ph, live, s, c)
    return s


@gluon.jit
def _wait_tile(ready, st, ph):
    for c in gl.static_range(9):
        mbarrier.wait(ready.index(st * 9 + c), ph)


@gluon.jit
def _producer_blocks(kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start, end,
                     n_tiles, num_pages, oob_row, TILE: gl.constexpr, PAGE: gl.constexpr,
                     STAGES: gl.constexpr, laps0=0, laps1=0):
    """The seesaw's copy warp: each tile's page ids, then its copies in 64-column blocks,
    each block's pages completing that block's ready mbarrier, part by part as the
    warpgroups release them (``empty[3 * stage + part]``): the right half, the rope, the
    left half. ``laps0`` / ``laps1``: the laps stage 0 / 1 made before (earlier segments)."""
    NP: gl.constexpr = TILE // PAGE if PAGE < TILE else 1
    for i in range(n_tiles):
        st = i % STAGES
        r0, r1, r2, r3, bits = _tile_ids(bt_row, start + i * TILE, end, True, num_pages,
                                         oob_row, TILE, PAGE)
        # a fresh mbarrier's preceding phase counts as complete: the first lap passes
        eph = ((i // STAGES + laps0 + (laps1 - laps0) * st) & 1) ^ 1
        kv = kv_smem.index(st)
        mbarrier.wait(empty.index(st * 3 + 2), eph)
        _copy_half(kv_desc, kv, ready, st, r0, r1, r2, r3, 4, TILE, PAGE)
        mbarrier.wait(empty.index(st * 3), eph)
        bar = ready.index(st * 9 + 8)
        mbarrier.expect(bar, NP * pe_desc.block_type.nbytes)
        _copy_block(pe_desc, pe_smem.index(st), bar, r0, r1, r2, r3, 0, TILE, PAGE)
        mbarrier.wait(empty.index(st * 3 + 1), eph)
        _copy_half(kv_desc, kv, ready, st, r0, r1, r2, r3, 0, TILE, PAGE)


@gluon.jit
def _copy_half(kv_desc, kv, ready, st, r0, r1, r2, r3, FIRST: gl.constexpr,
               TILE: gl.constexpr, PAGE: gl.constexpr):
    """The four latent blocks from block ``FIRST`` (0: the left half, 4: the right) of a
    tile into its stage ``kv``, each completing its own ready mbarrier."""
    NP: gl.constexpr = TILE // PAGE if PAGE < TILE else 1
    for c in gl.static_range(FIRST, FIRST + 4):
        bar = ready.index(st * 9 + c)
        mbarrier.expect(bar, NP * kv_desc.block_type.nbytes)
        _copy_block(kv_desc, kv.slice(c * 64, 64, dim=1), bar, r0, r1, r2, r3, c * 64, TILE,
                    PAGE)


@gluon.jit
def _copy_block(desc, dst, bar, r0, r1, r2, r3, col: gl.constexpr, TILE: gl.constexpr,
                PAGE: gl.constexpr):
    NP: gl.constexpr = TILE // PAGE if PAGE < TILE else 1
    if NP == 1:
        tma.async_copy_global_to_shared(desc, [r0, col], bar, dst)
    else:
        tma.async_copy_global_to_shared(desc, [r0, col], bar, dst.slice(0, PAGE, dim=0))
        tma.async_copy_global_to_shared(desc, [r1, col], bar, dst.slice(PAGE, PAGE, dim=0))
        if NP > 2:
            tma.async_copy_global_to_shared(desc, [r2, col], bar,
                                            dst.slice(2 * PAGE, PAGE, dim=0))
            tma.async_copy_global_to_shared(desc, [r3, col], bar,
                                            dst.slice(3 * PAGE, PAGE, dim=0))


@gluon.jit
def _give_p_b(p16, m_b, p_smem, m_b_smem, pa_done, pb_ready, ph, vec_l: gl.constexpr):
    """Warpgroup 1: B's P and the pair's row max to warpgroup 0, once its PV MMA of A is
    done with the P buffer (``pa_done``)."""
    mbarrier.wait(pa_done, ph)
    p_smem.store(p16)
    m_b_smem.store(gl.convert_layout(m_b, vec_l))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(pb_ready, count=1)


@gluon.jit
def _seesaw_seg(ME: gl.constexpr, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem,
                l_smem, ready, empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar,
                q_free, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale,
                PO, PL, b, split, pid_h, heads, stride_pob, stride_poh, stride_pos,
                stride_plb, stride_plh, laps0, laps1, seg, BLOCK_H: gl.constexpr,
                TILE: gl.constexpr, PAGE: gl.constexpr, DV: gl.constexpr,
                QLEN: gl.constexpr, PLAN: gl.constexpr):
    """Warpgroup ``ME`` (0 or 1) of the bf16 seesaw (the module docstring's protocol) over
    one segment of tokens ``[start, end)`` (a split's, or a work plan's segment ``seg`` of
    its part, after ``laps0`` pairs and ``laps1`` tiles in stage 1). Warpgroup 0 scores A and
    holds O's left 256 columns, warpgroup 1 scores B and holds the right ones. The row
    sums stay per warpgroup (each of the P it computed) until the end (``fin_bar``). With
    ``PLAN`` each warpgroup arrives ``q_free`` once its last score MMA is done (the copy
    warp loads the next segment's q)."""
    HALF: gl.constexpr = DV // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    # B's P as the PV MMA's A operand from registers (the accumulator's own layout at
    # k_width 2: no data moves)
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    vec_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    zero_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    NEG: gl.constexpr = float("-inf")

    m_old = gl.full([BLOCK_H], NEG, gl.float32, layout=row_s)
    l_me = gl.zeros([BLOCK_H], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    offs_t = gl.arange(0, TILE, layout=col_s)
    if PAGE >= TILE:  # the tile is within one page: bit 0
        page_bit: gl.constexpr = 1
    else:
        page_bit = (1 << (offs_t // PAGE))[None, :]
    clean_end = end
    row_end = end
    if QLEN > 1:  # each row's visible end: its token's causal limit, within the split
        tok_s = (pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)) // heads
        row_end = gl.minimum(seq_len - (QLEN - 1) + tok_s, end)
        clean_end = gl.minimum(seq_len - (QLEN - 1) + (pid_h * BLOCK_H) // heads, end)
    m_a_smem = m_smem.slice(0, BLOCK_H)
    m_b_smem = m_smem.slice(BLOCK_H, BLOCK_H)
    mbarrier.wait(q_bar, seg & 1)

    for j in range(gl.cdiv(n_tiles, 2)):
        ph = (laps0 + j) & 1  # stage 0's laps and the pair's mbarriers
        ph_b = (laps1 + j) & 1  # stage 1's (a segment's odd last pair has no B)
        last = 2 * j + 2 >= n_tiles
        n_a = start + 2 * j * TILE
        n_b = n_a + TILE
        has_b = 2 * j + 1 < n_tiles
        # A's stage is 0 and B's 1, written as values the compiler cannot fold (n_a >= 0):
        # with constant stages it derives every MMA descriptor of both stages (60 64-bit
        # values) before the loop and spills them; now each is formed where it is used
        st_a = (n_a >> 31) & 1
        kv_a = kv_smem.index(st_a)
        kv_b = kv_smem.index(1 - st_a)
        pe_a = pe_smem.index(st_a)
        pe_b = pe_smem.index(1 - st_a)
        if ME == 0:
            bits = _tile_ids(bt_row, n_a, end, True, num_pages, oob_row, TILE, PAGE)[4]
            if n_a + TILE > end:  # the split's last, partial tile
                _wait_tile(ready, st_a, ph)
                _zero_tail(kv_a, end - n_a, zero_l, TILE, DV)
            s = _seesaw_scores(q_smem, qpe_smem, kv_a, pe_a, ready, st_a, ph, True, s_layout,
                               BLOCK_H, TILE)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            mbarrier.arrive(sa_done, count=1)  # warpgroup 1's score MMA may start
            if PLAN:
                _free_q(q_free, last)
            s = _masked_scores(s, bits, n_a, qk_scale, clean_end, end, row_end, offs_t,
                               page_bit, TILE, PAGE, QLEN)
            m_a = gl.maximum(m_old, gl.max(s, 1))
            m_a_use = gl.where(m_a == NEG, 0.0, m_a)
            alpha = gl.exp2(m_old - m_a_use)
            p = gl.exp2(s - m_a_use[:, None])
            l_me = l_me * alpha + gl.sum(p, 1)
            # the P buffer is free: its last reader was this warpgroup's PV MMA of the last
            # B (waited), and warpgroup 1 stored that P before pb_ready (waited)
            p_smem.store(p.to(gl.bfloat16))
            m_a_smem.store(gl.convert_layout(m_a, vec_l))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(pa_ready, count=1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            acc = warpgroup_mma(p_smem, kv_a.slice(0, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # the warpgroup's MMAs are done with A's P, rope, left half
            mbarrier.arrive(pa_done, count=1)
            mbarrier.arrive(empty.index(0), count=1)
            mbarrier.arrive(empty.index(1), count=1)
            mbarrier.wait(pb_ready, ph)  # B's P and the pair's row max
            m_b = gl.convert_layout(m_b_smem.load(vec_l), row_s)
            beta = gl.exp2(m_a_use - gl.where(m_b == NEG, 0.0, m_b))
            l_me = l_me * beta
            acc = acc * gl.convert_layout(beta, row_o)[:, None]
            if has_b:
                acc = warpgroup_mma(p_smem, kv_b.slice(0, HALF, dim=1), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                gl.thread_barrier()  # the warpgroup's MMA is done with B's left half
                mbarrier.arrive(empty.index(4), count=1)
        else:
            bits = _tile_ids(bt_row, n_b, end, has_b, num_pages, oob_row, TILE, PAGE)[4]
            if has_b:
                if n_b + TILE > end:
                    _wait_tile(ready, 1 - st_a, ph_b)
                    _zero_tail(kv_b, end - n_b, zero_l, TILE, DV)
            # staggered: B's score MMA runs under warpgroup 0's softmax of A (without B,
            # it reads a stage no copy fills and every score is masked)
            mbarrier.wait(sa_done, ph)
            s = _seesaw_scores(q_smem, qpe_smem, kv_b, pe_b, ready, 1 - st_a, ph_b, has_b,
                               s_layout, BLOCK_H, TILE)
            mbarrier.wait(pa_ready, ph)  # A's P and row max
            m_a = gl.convert_layout(m_a_smem.load(vec_l), row_s)
            m_a_use = gl.where(m_a == NEG, 0.0, m_a)
            acc = acc * gl.convert_layout(gl.exp2(m_old - m_a_use), row_o)[:, None]
            acc = warpgroup_mma(p_smem, kv_a.slice(HALF, HALF, dim=1), acc, is_async=True)
            # B's scores (issued before A's PV MMA) are done; the PV MMA may still run
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            if PLAN:
                _free_q(q_free, last)
            s = _masked_scores(s, bits, n_b, qk_scale, clean_end, end, row_end, offs_t,
                               page_bit, TILE, PAGE, QLEN)
            m_b = gl.maximum(m_a, gl.max(s, 1))
            m_b_use = gl.where(m_b == NEG, 0.0, m_b)
            p = gl.exp2(s - m_b_use[:, None])
            l_me = l_me * gl.exp2(m_old - m_b_use) + gl.sum(p, 1)
            p16 = p.to(gl.bfloat16)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # the warpgroup's MMA is done with A's right half
            mbarrier.arrive(empty.index(2), count=1)
            acc = acc * gl.convert_layout(gl.exp2(m_a_use - m_b_use), row_o)[:, None]
            # P_B to warpgroup 0 first (no register of an in-flight MMA read), then B's
            # PV MMA with P_B from registers
            _give_p_b(p16, m_b, p_smem, m_b_smem, pa_done, pb_ready, ph, vec_l)
            if has_b:
                acc = warpgroup_mma(gl.convert_layout(p16, p_op),
                                    kv_b.slice(HALF, HALF, dim=1), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                gl.thread_barrier()  # the warpgroup's MMAs are done with B's right half, rope
                mbarrier.arrive(empty.index(5), count=1)
                mbarrier.arrive(empty.index(3), count=1)
        m_old = m_b

    # the row sums: each warpgroup's own (at the final row max), then both
    l_smem.slice(ME * BLOCK_H, BLOCK_H).store(gl.convert_layout(l_me, vec_l))
    gl.thread_barrier()
    mbarrier.arrive(fin_bar, count=1)
    mbarrier.wait(fin_bar, seg & 1)
    l_i = l_me + gl.convert_layout(l_smem.slice((1 - ME) * BLOCK_H, BLOCK_H).load(vec_l),
                                   row_s)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    out = acc / gl.convert_layout(l_safe, row_o)[:, None]
    _store_partials(out, m_old + gl.log2(l_safe), ME == 0, ME * HALF, n_tiles > 0, PO, PL, b,
                    split, pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb,
                    stride_plh, row_s, row_o, col_o, BLOCK_H, HALF, DV, QLEN)


@gluon.jit
def _next_laps(laps0, laps1, n_tiles):
    """The ring's laps after a segment of ``n_tiles`` tiles: stage 0 takes each pair's A
    tile, stage 1 each B tile (an odd last pair has none)."""
    return laps0 + gl.cdiv(n_tiles, 2), laps1 + n_tiles // 2


@gluon.jit
def _seesaw_wg(ME: gl.constexpr, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem,
               ready, empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar, q_free,
               bt_row, start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b,
               split, pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb,
               stride_plh, WP, SL, BT, stride_btb, max_len, seg0, n_seg,
               BLOCK_H: gl.constexpr, TILE: gl.constexpr, PAGE: gl.constexpr,
               DV: gl.constexpr, QLEN: gl.constexpr, PLAN: gl.constexpr):
    """Warpgroup ``ME`` over its program's work: the split's tokens, or (``PLAN``) the
    ``n_seg`` segments of its part from slot ``seg0`` on (work_plan.py), the ring's laps
    and the pairs' mbarriers' phases carried from segment to segment."""
    if PLAN:
        laps0 = n_seg * 0  # pairs so far (stage 0's laps)
        laps1 = n_seg * 0  # stage 1's laps
        for k in range(n_seg):
            b, start, end, seq_len, n_tiles, bt_row = _segment(WP, SL, BT, stride_btb, max_len,
                                                               seg0 + k, TILE)
            _seesaw_seg(ME, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem,
                        ready, empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar,
                        q_free, bt_row, start, end, n_tiles, seq_len, num_pages, oob_row,
                        qk_scale, PO, PL, b, seg0 + k, pid_h, heads, stride_pob, stride_poh,
                        stride_pos, stride_plb, stride_plh, laps0, laps1, k, BLOCK_H, TILE, PAGE,
                        DV, QLEN, True)
            laps0, laps1 = _next_laps(laps0, laps1, n_tiles)
    else:
        _seesaw_seg(ME, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                    empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar, q_free,
                    bt_row, start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO,
                    PL, b, split, pid_h, heads, stride_pob, stride_poh, stride_pos,
                    stride_plb, stride_plh, 0, 0, 0, BLOCK_H, TILE, PAGE, DV, QLEN, False)


@gluon.jit
def _seesaw_wg0(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar, q_free, bt_row,
                start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
                pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, WP,
                SL, BT, stride_btb, max_len, seg0, n_seg, BLOCK_H: gl.constexpr,
                TILE: gl.constexpr, PAGE: gl.constexpr, DV: gl.constexpr,
                QLEN: gl.constexpr, PLAN: gl.constexpr):
    _seesaw_wg(0, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
               empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar, q_free, bt_row,
               start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
               pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, WP,
               SL, BT, stride_btb, max_len, seg0, n_seg, BLOCK_H, TILE, PAGE, DV, QLEN, PLAN)


@gluon.jit
def _seesaw_wg1(q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
                empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar, q_free, bt_row,
                start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
                pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, WP,
                SL, BT, stride_btb, max_len, seg0, n_seg, BLOCK_H: gl.constexpr,
                TILE: gl.constexpr, PAGE: gl.constexpr, DV: gl.constexpr,
                QLEN: gl.constexpr, PLAN: gl.constexpr):
    _seesaw_wg(1, q_smem, qpe_smem, kv_smem, pe_smem, p_smem, m_smem, l_smem, ready,
               empty, pa_ready, pb_ready, pa_done, sa_done, fin_bar, q_bar, q_free, bt_row,
               start, end, n_tiles, seq_len, num_pages, oob_row, qk_scale, PO, PL, b, split,
               pid_h, heads, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, WP,
               SL, BT, stride_btb, max_len, seg0, n_seg, BLOCK_H, TILE, PAGE, DV, QLEN, PLAN)


@gluon.jit
def _seesaw_producer(kv_desc, pe_desc, q_desc, qpe_desc, kv_smem, pe_smem, q_smem, qpe_smem,
                     ready, empty, q_bar, q_free, bt_row, start, end, n_tiles, num_pages,
                     oob_row, pid_h, heads, WP, SL, BT, stride_btb, max_len, seg0, n_seg,
                     TILE: gl.constexpr, PAGE: gl.constexpr, STAGES: gl.constexpr,
                     BLOCK_H: gl.constexpr, QLEN: gl.constexpr, PLAN: gl.constexpr):
    """The seesaw's copy warp over its program's work (see :func:`_seesaw_wg`); with
    ``PLAN`` it also loads each segment's q, the next once both warpgroups freed it."""
    if PLAN:
        laps0 = n_seg * 0
        laps1 = n_seg * 0
        for k in range(n_seg):
            b, start, end, seq_len, n_tiles, bt_row = _segment(WP, SL, BT, stride_btb, max_len,
                                                               seg0 + k, TILE)
            _load_q(q_desc, qpe_desc, q_smem, qpe_smem, q_bar, q_free, k, b, pid_h, heads,
                    BLOCK_H, QLEN)
            _producer_blocks(kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start,
                             end, n_tiles, num_pages, oob_row, TILE, PAGE, STAGES, laps0, laps1)
            laps0, laps1 = _next_laps(laps0, laps1, n_tiles)
    else:
        _producer_blocks(kv_desc, pe_desc, kv_smem, pe_smem, ready, empty, bt_row, start, end,
                         n_tiles, num_pages, oob_row, TILE, PAGE, STAGES)
