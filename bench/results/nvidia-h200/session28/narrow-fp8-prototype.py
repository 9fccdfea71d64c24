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
Where it stands (session 28): the K^T relabel is trivial and the operands load in 16-byte
runs, but the compiled loop still repacks fp16 halves (809 PRMT, 291 LOP3 a tile and warp
at 232 registers, 3.8 KB of spills): the converted values reach the MMA operands through
per-element extracts. Next: produce each operand register's two halves in one conversion
(``cvt.rn.f16x2.e4m3x2`` on the byte pair the fragment wants: for K^T the pair along k0,
for V the pair of two token rows, formed with ``prmt``) so no repacking is left.
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
    """A tile's raw fp8 bytes in the three register layouts: K^T [w, kp, n] (LK), the rope's
    K^T [w, kp, n] (LP), V [w, tok, cp] (LV); 16-, 4- and 16-byte runs a thread."""
    w, kp, n = _idx3(W, CW, T, LK)
    row, ok = _rows(BT, n0, end, stride_kp, stride_kt, n, PAGE)
    k = gl.load(KV + row + w * CW + kp, mask=ok, other=0)
    w, kp, n = _idx3(W, PE, T, LP)
    row, ok = _rows(BT, n0, end, stride_kp, stride_kt, n, PAGE)
    pe = gl.load(KV + row + DV + w * PE + kp, mask=ok, other=0)
    w, tok, cp = _idx3(W, T, CW, LV)
    row, ok = _rows(BT, n0, end, stride_kp, stride_kt, tok, PAGE)
    v = gl.load(KV + row + w * CW + cp, mask=ok, other=0)
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
    # K^T [w, kp, n]: a thread's dot-operand k bits (0, 3, 4, 5, 6) as the low bits of the
    # physical column kp (32 contiguous bytes), its lane's k bits (1, 2) as kp bits (5, 6)
    LK: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0], [0, 0, 8],
                   [0, 0, 16]],
        lane_bases=[[0, 32, 0], [0, 64, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[W, CW, T])
    # the rope's K^T [w, kp, n]: k bits (0, 3) -> kp (0, 1), lane k bits (1, 2) -> kp (2, 3)
    LP: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0], [0, 2, 0], [0, 0, 8], [0, 0, 16]],
        lane_bases=[[0, 4, 0], [0, 8, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[W, PE, T])
    # V [w, tok, cp]: output column bits (3-6) of a thread as the low bits of the physical
    # column cp (16 contiguous bytes a token), the lane's column bits (0-2) as cp (4-6)
    LV: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 1, 0], [0, 8, 0],
                   [0, 16, 0]],
        lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 16], [0, 0, 32], [0, 0, 64]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[W, T, CW])
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
        # K^T: convert, relabel kp -> k (free), score
        kt = gl.reshape(_f8_f16(kr), [W, 2, 2, 2, 2, 2, 2, 2, T])
        kt = gl.reshape(gl.permute(kt, [0, 3, 4, 5, 6, 1, 2, 7, 8]), [W, CW, T])
        kt = gl.convert_layout(kt, b_op, assert_trivial=True)
        pt = gl.reshape(_f8_f16(pr), [W, 2, 2, 2, 2, T])
        pt = gl.reshape(gl.permute(pt, [0, 3, 1, 2, 4, 5]), [W, PE, T])
        pt = gl.convert_layout(pt, b_op, assert_trivial=True)
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
        vt = gl.reshape(_f8_f16(vr), [W, T, 2, 2, 2, 2, 2, 2, 2])
        vt = gl.reshape(gl.permute(vt, [0, 1, 5, 6, 7, 8, 2, 3, 4]), [W, T, CW])
        vt = gl.convert_layout(vt, b_op)
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
    kv8 = kv.view(torch.uint8)
    _narrow_fp8_stage1[(b, splits)](
        q, kv8, block_table, seq_lens, po, pl, k_scale, v_scale, scale * 1.4426950408889634,
        heads, block_table.shape[1] * page, q.stride(0), q.stride(1), kv8.stride(0),
        kv8.stride(1), block_table.stride(0), po.stride(0), po.stride(1), po.stride(2),
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
    types = ["*bf16", "*u8", "*i32", "*i32", "*fp32", "*fp32", "*fp32", "*fp32", "fp32"]
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
