"""Prototype (session 28, not landed): a narrow stage 1 for fp8 latents (absorbed MLA, at most
16 (token, head) rows a request) whose MMA operands come from registers.

The landed narrow latent tile (latent.py) is bound by shared memory with an fp8 cache
(docs/decode_notes.md v28): its 4 warps split a tile's tokens, so each reloads the whole
16 x 576 q every tile, and the fp8 tile is staged through shared memory twice (raw, then
converted to fp16 for ``ldmatrix``). Here the 4 warps split the latent's columns instead
(warp w: latent columns [128 w, 128 w + 128) and rope columns [512 + 16 w, +16)):

- q stays in registers (a 16 x 144 slice a warp: 36 registers a thread);
- each operand is loaded from global memory straight into registers in 16-byte runs and
  converted there (``cvt.rn.f16x2.e4m3x2``): for the scores, K^T's columns are permuted
  so that a thread's dot-operand elements are contiguous bytes (q loaded with the same
  permutation, once); for PV, the output columns are permuted so that a thread's 16
  columns are contiguous bytes of each token row (the partial is stored un-permuted);
  the relabelling is a reshape / permute of the loaded tensor that compiles to nothing
  (``convert_layout(..., assert_trivial=True)`` for K^T);
- the scores are summed over the 4 warps (a cross-warp reduction through shared memory,
  16 x 32 floats a warp a tile), every warp runs the softmax on the whole 16 x 32 tile
  and multiplies its P by its own 128 columns of V (``mma.sync``, P from the score
  accumulator's registers);
- the next tile's bytes are loaded while the current one computes (registers, no ring).

Not done: page-id validation (ids are trusted here), sliding windows, logit caps, more
than one query token, the balanced grid; the host launch, the config and the tuner.
Compiles for sm_90a (``compile_narrow()`` below; launch with ``maxnreg``: ptxas otherwise
holds it to 32 registers); numerics and speed unverified (no device time was left).
Where it stands (session 28): every operand is loaded as 16-byte runs of int32 words
and converted by ``cvt.rn.f16x2.e4m3x2`` straight into its MMA register (K^T's byte pairs
along k, V's formed from two token rows by ``prmt``), the relabelling costs nothing, and
the compiled loop has no shared memory but the score sum's: 1,120 instructions a 32-token
tile and warp at 232 registers (180 B of spills), 136 conversions, 32 ``prmt``. That is
4,480 warp instructions a tile against the landed tile's 2,476: the latent is converted
twice (once per operand) and every warp runs the whole tile's softmax. The landed tile
issues at 0.99 instructions a cycle (its shared-memory waits); this one would need ~1.8 to
match it, so the register design alone does not promise the fp8 target.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

W = gl.constexpr(4)     # warps: latent column quarters
H = gl.constexpr(16)    # rows (heads) a program
T = gl.constexpr(32)    # tokens a tile
CW = gl.constexpr(128)  # latent columns a warp
PE = gl.constexpr(16)   # rope columns a warp
DV = gl.constexpr(512)
DK = gl.constexpr(576)


@gluon.jit
def _f8_f16(x):
    """fp8 e4m3 bytes (uint8, four consecutive register elements) to fp16."""
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
        "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit
def _w_f16(x):
    """An int32 word of four fp8 e4m3 bytes to four fp16 values (bytes 0-3), one
    ``cvt.rn.f16x2.e4m3x2`` a byte pair."""
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 a, b; mov.b32 {lo, hi}, $4; "
        "cvt.rn.f16x2.e4m3x2 a, lo; cvt.rn.f16x2.e4m3x2 b, hi; "
        "mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; }",
        "=h,=h,=h,=h,r", [x], dtype=(gl.float16, gl.float16, gl.float16, gl.float16),
        is_pure=True, pack=1)


@gluon.jit
def _w2_f16(a, b):
    """Two int32 words (two token rows' bytes of the same four columns) to the four
    (row a, row b) fp16 pairs, column by column: one ``prmt`` per two pairs."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 p, q, x, y, z, w; .reg .b16 pl, ph, ql, qh; "
        "prmt.b32 p, $8, $9, 0x5140; prmt.b32 q, $8, $9, 0x7362; "
        "mov.b32 {pl, ph}, p; mov.b32 {ql, qh}, q; "
        "cvt.rn.f16x2.e4m3x2 x, pl; cvt.rn.f16x2.e4m3x2 y, ph; "
        "cvt.rn.f16x2.e4m3x2 z, ql; cvt.rn.f16x2.e4m3x2 w, qh; "
        "mov.b32 {$0, $1}, x; mov.b32 {$2, $3}, y; mov.b32 {$4, $5}, z; "
        "mov.b32 {$6, $7}, w; }",
        "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [a, b], dtype=(gl.float16,) * 8, is_pure=True,
        pack=1)


@gluon.jit
def _idx3(n0: gl.constexpr, n1: gl.constexpr, n2: gl.constexpr, layout: gl.constexpr):
    """The three index vectors of a [n0, n1, n2] tensor in ``layout``, expanded to 3-D."""
    i0 = gl.arange(0, n0, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    i1 = gl.arange(0, n1, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    i2 = gl.arange(0, n2, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    return (gl.expand_dims(gl.expand_dims(i0, 1), 2), gl.expand_dims(gl.expand_dims(i1, 0), 2),
            gl.expand_dims(gl.expand_dims(i2, 0), 1))


@gluon.jit
def _rows(BT, n0, end, stride_kp, stride_kt, tok, PAGE: gl.constexpr):
    """Byte offsets of tokens ``n0 + tok`` (a 3-D index tensor) in the cache, and their
    in-range mask (ids trusted: a prototype)."""
    t = n0 + tok
    ok = t < end
    page = gl.load(BT + t // PAGE, mask=ok, other=0).to(gl.int64)
    return page * stride_kp + (t % PAGE) * stride_kt, ok


@gluon.jit
def _load_tile(KV, BT, n0, end, stride_kp, stride_kt, PAGE: gl.constexpr,
               LK: gl.constexpr, LP: gl.constexpr, LV: gl.constexpr):
    """A tile's raw fp8 bytes as int32 words in the three register layouts: K^T
    [w, kw, n] (LK: 8 contiguous words a thread), the rope's [w, pw, n] (LP: one word),
    V [w, tok, cw] (LV: 4 contiguous words a token)."""
    w, kw, n = _idx3(W, CW // 4, T, LK)
    row, ok = _rows(BT, n0, end, stride_kp, stride_kt, n, PAGE)
    k = gl.load(KV + row // 4 + w * (CW // 4) + kw, mask=ok, other=0)
    w, pw, n = _idx3(W, PE // 4, T, LP)
    row, ok = _rows(BT, n0, end, stride_kp, stride_kt, n, PAGE)
    pe = gl.load(KV + row // 4 + DV // 4 + w * (PE // 4) + pw, mask=ok, other=0)
    w, tok, cw = _idx3(W, T, CW // 4, LV)
    row, ok = _rows(BT, n0, end, stride_kp, stride_kt, tok, PAGE)
    v = gl.load(KV + row // 4 + w * (CW // 4) + cw, mask=ok, other=0)
    return k, pe, v


@gluon.jit
def _narrow_fp8_stage1(Q, KV, BT, SL, PO, PL, KS, VS, qk_scale, heads, max_len,
                       stride_qb, stride_qh, stride_kp, stride_kt, stride_btb,
                       stride_pob, stride_pos, stride_poh, stride_plb, stride_pls,
                       PAGE: gl.constexpr, SPLITS: gl.constexpr):
    """One program per (request, split): the split's normalized partial output (fp32,
    ``PO[b, split, h, :]``) and its log2-sum-exp (``PL[b, split, h]``, -inf when empty)."""
    gl.static_assert(gl.num_warps() == W)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1],
                                                  instr_shape=[1, 16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # K^T as words [w, kw, n]: a byte's physical column kp = 4 kw + byte; the operand's k
    # bits (0, 3) are the byte's, (4, 5, 6) a thread's word bits (8 contiguous words),
    # (1, 2) the lane's word bits (3, 4)
    LK: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 0, 8], [0, 0, 16]],
        lane_bases=[[0, 8, 0], [0, 16, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[W, CW // 4, T])
    # the rope's K^T words [w, pw, n]: k bits (0, 3) the byte's, (1, 2) the lane's word
    LP: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 8], [0, 0, 16]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[W, PE // 4, T])
    # V words [w, tok, cw]: a thread's 4 contiguous words (16 columns) of tokens with bits
    # (0, 3, 4) in its registers; the output column n has bits (3-6) = the physical
    # column's (0-3) and (0-2) = its (4-6)
    LV: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 8, 0], [0, 16, 0]],
        lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 4], [0, 0, 8], [0, 0, 16]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[W, T, CW // 4])
    s_l: gl.constexpr = gl.SliceLayout(0, mma)          # [H, T] scores, every warp
    row_l: gl.constexpr = gl.SliceLayout(1, s_l)         # [H]
    col_l: gl.constexpr = gl.SliceLayout(0, s_l)         # [T]
    NEG: gl.constexpr = float("-inf")

    b = gl.program_id(0)
    split = gl.program_id(1)
    seq_len = gl.minimum(gl.maximum(gl.load(SL + b), 0), max_len)
    chunk = gl.maximum(gl.cdiv(gl.cdiv(seq_len, SPLITS), T) * T, T)
    start = split * chunk
    end = gl.minimum(start + chunk, seq_len)
    bt = BT + b * stride_btb
    qk_scale = qk_scale * gl.load(KS)

    # q [w, h, k] in the A operand layout, its columns permuted as K^T's (sigma)
    w, h, k = _idx3(W, H, CW, a_op)
    sig = (k & 1) | (((k >> 3) & 15) << 1) | (((k >> 1) & 3) << 5)
    q = gl.load(Q + b * stride_qb + h * stride_qh + w * CW + sig, mask=(h < heads) & (k >= 0),
                other=0.0)
    q = gl.minimum(gl.maximum(q.to(gl.float32), -65504.0), 65504.0).to(gl.float16)
    w, h, k = _idx3(W, H, PE, a_op)
    sig = (k & 1) | (((k >> 3) & 1) << 1) | (((k >> 1) & 3) << 2)
    qpe = gl.load(Q + b * stride_qb + h * stride_qh + DV + w * PE + sig,
                  mask=(h < heads) & (k >= 0), other=0.0)
    qpe = gl.minimum(gl.maximum(qpe.to(gl.float32), -65504.0), 65504.0).to(gl.float16)

    m_i = gl.full([H], NEG, gl.float32, layout=row_l)
    l_i = gl.zeros([H], gl.float32, layout=row_l)
    acc = gl.zeros([W, H, CW], gl.float32, layout=mma)
    offs_t = gl.arange(0, T, layout=col_l)
    kr, pr, vr = _load_tile(KV, bt, start, end, stride_kp, stride_kt, PAGE, LK, LP, LV)
    for n0 in range(start, end, T):
        nk, npe, nv = _load_tile(KV, bt, n0 + T, end, stride_kp, stride_kt, PAGE, LK, LP, LV)
        # K^T: each word to four fp16, relabelled to the operand's k order (free)
        o0, o1, o2, o3 = _w_f16(kr)
        x = gl.join(gl.join(o0, o1), gl.join(o2, o3))          # [w, kw, n, a, b]
        x = gl.reshape(x, [W, 4, 8, T, 2, 2])                 # kw = (kw4 kw3, kw2-0)
        x = gl.permute(x, [0, 2, 5, 1, 4, 3])                 # k = (kw2-0, b, kw4 kw3, a)
        kt = gl.convert_layout(gl.reshape(x, [W, CW, T]), b_op)
        o0, o1, o2, o3 = _w_f16(pr)
        x = gl.join(gl.join(o0, o1), gl.join(o2, o3))          # [w, pw, n, a, b]
        x = gl.permute(gl.reshape(x, [W, 2, 2, T, 2, 2]), [0, 5, 1, 2, 4, 3])
        pt = gl.convert_layout(gl.reshape(x, [W, PE, T]), b_op)
        s3 = mma_v2(q, kt, gl.zeros([W, H, T], gl.float32, layout=mma))
        s3 = mma_v2(qpe, pt, s3)
        s = gl.sum(s3, axis=0) * qk_scale
        s = gl.where(gl.expand_dims(n0 + offs_t < end, 0), s, NEG)
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == NEG, 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - gl.expand_dims(m_use, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # P (every warp's own copy) times the warp's 128 columns of V
        p3 = gl.expand_dims(p.to(gl.float16), 0) + gl.zeros([W, H, T], gl.float16, layout=mma)
        p3 = gl.convert_layout(p3, a_op)
        # V: the two token rows of each pair side by side, column by column
        va, vb = gl.split(gl.permute(gl.reshape(vr, [W, T // 2, 2, CW // 4]), [0, 1, 3, 2]))
        a0, b0, a1, b1, a2, b2, a3, b3 = _w2_f16(va, vb)
        z = gl.join(gl.join(gl.join(a0, b0), gl.join(a1, b1)),
                    gl.join(gl.join(a2, b2), gl.join(a3, b3)))   # [w, tp, cw, s, c0, c1]
        z = gl.reshape(z, [W, T // 2, 8, 4, 2, 2, 2])          # cw = (cw4-2, cw1 cw0)
        z = gl.permute(z, [0, 1, 4, 3, 6, 5, 2])               # (tp, s), (cw1-0, c1, c0, cw4-2)
        vt = gl.convert_layout(gl.reshape(z, [W, T, CW]), b_op)
        acc = mma_v2(p3, vt, acc * _bcast_rows(alpha, mma))
        kr, pr, vr = nk, npe, nv

    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    inv = gl.load(VS) / l_safe
    out = acc * _bcast_rows(inv, mma)
    w, h, n = _idx3(W, H, CW, mma)
    col = w * CW + (((n >> 3) & 15) | ((n & 7) << 4))   # the output columns, un-permuted
    has = start < end
    gl.store(PO + b * stride_pob + split * stride_pos + h * stride_poh + col, out,
             mask=(h < heads) & (n >= 0) & has)
    offs_h = gl.arange(0, H, layout=row_l)
    lse = gl.where(has, m_i + gl.log2(l_safe), NEG)
    gl.store(PL + b * stride_plb + split * stride_pls + offs_h, lse, mask=offs_h < heads)


@gluon.jit
def _bcast_rows(x, mma: gl.constexpr):
    """A per-row ([H], the scores' row layout) value as a [1, H, 1] tensor in ``mma``'s
    3-D layout (every warp holds every row)."""
    x = gl.convert_layout(x, gl.SliceLayout(0, gl.SliceLayout(2, mma)))
    return gl.expand_dims(gl.expand_dims(x, 0), 2)


def narrow_fp8(q: torch.Tensor, kv: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, scale: float, k_scale: torch.Tensor,
               v_scale: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 on ``q [B, heads <= 16, 576]`` (bf16) over ``kv [pages, page, 1, 576]``
    (float8_e4m3fn): ``(partials [B, splits, 16, 512], lse [B, splits, 16])``."""
    b, heads, dk = q.shape
    assert dk == DK.value and heads <= H.value and kv.dtype == torch.float8_e4m3fn and kv.shape[2] == 1
    assert q.stride(2) == 1 and kv.stride(3) == 1
    po = torch.empty(b, splits, H.value, DV.value, device=q.device, dtype=torch.float32)
    pl = torch.empty(b, splits, H.value, device=q.device, dtype=torch.float32)
    page = kv.shape[1]
    kv8 = kv.view(torch.int32)
    _narrow_fp8_stage1[(b, splits)](
        q, kv8, block_table, seq_lens, po, pl, k_scale, v_scale, scale * 1.4426950408889634,
        heads, block_table.shape[1] * page, q.stride(0), q.stride(1), kv8.stride(0) * 4,
        kv8.stride(1) * 4, block_table.stride(0), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), PAGE=page, SPLITS=splits, num_warps=W.value, maxnreg=232)
    return po, pl


def merge(po: torch.Tensor, pl: torch.Tensor, heads: int) -> torch.Tensor:
    """The splits' partials merged (fp32 ``[B, heads, 512]``)."""
    m = pl.max(dim=1, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(pl - m)
    out = (po * w[..., None]).sum(1) / w.sum(1)[..., None].clamp_min(1e-30)
    return out[:, :heads]


def compile_narrow(page: int = 16, splits: int = 33, maxnreg: int = 232):
    """Compile the stage 1 for sm_90a on a machine without a GPU (Triton's ptxas): the
    compiled kernel (``.asm["ptx"]``, ``["cubin"]``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    names = _narrow_fp8_stage1.arg_names
    types = ["*bf16", "*i32", "*i32", "*i32", "*fp32", "*fp32", "*fp32", "*fp32", "fp32"]
    sig = {n: (types[i] if i < len(types) else "i32") for i, n in enumerate(names)}
    sig.update(PAGE="constexpr", SPLITS="constexpr")
    aligned = [i for i, n in enumerate(names) if i < 8 or n.startswith("stride")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    return triton.compile(GluonASTSource(_narrow_fp8_stage1, sig,
                                         {"PAGE": page, "SPLITS": splits}, attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": W.value, "maxnreg": maxnreg})


def main() -> None:
    """On a GPU: the prototype against the fp32 reference and beside kdispatch's decode
    (Kimi-K3 TP8's shape, 12 heads, fp8 latent, 16-token pages, full context)."""
    import kdispatch
    from kdispatch.kernels.decode_attention.reference import reference_decode_attention
    torch.manual_seed(0)
    dev = "cuda"
    for b, ctx, splits, check in ((2, 1000, 4, True), (8, 327600, 33, False)):
        heads, page = 12, 16
        pages = -(-ctx // page)
        q = torch.randn(b, heads, DK.value, device=dev, dtype=torch.bfloat16)
        ks = torch.tensor([0.02], device=dev)
        vs = torch.tensor([0.02], device=dev)
        kv = (torch.randn(b * pages, page, 1, DK.value, device=dev) / 0.02 * 0.5).to(
            torch.float8_e4m3fn)
        bt = torch.randperm(b * pages, device=dev, dtype=torch.int32).view(b, pages)
        sl = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        scale = DK.value ** -0.5
        po, pl = narrow_fp8(q, kv, bt, sl, scale, ks, vs, splits)
        out = merge(po, pl, heads)
        if check:
            ref = reference_decode_attention(q, kv, kv[..., :DV.value], bt, sl, scale=scale,
                                             k_scale=ks, v_scale=vs)
            print(f"b{b} x {ctx}: max abs error {(out - ref).abs().max().item():.3e}")
        t_p = triton.testing.do_bench(lambda: narrow_fp8(q, kv, bt, sl, scale, ks, vs, splits))
        t_k = triton.testing.do_bench(lambda: kdispatch.decode_attention(
            q, kv, kv[..., :DV.value], bt, sl, scale=scale, k_scale=ks, v_scale=vs))
        print(f"b{b} x {ctx}: prototype stage 1 {t_p * 1e3:.1f} us, kdispatch decode "
              f"{t_k * 1e3:.1f} us")


if __name__ == "__main__":
    main()
