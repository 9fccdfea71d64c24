"""The fused K+V paged-cache writer kernel of ``kv_write`` (and its fp8 quantizer)."""

import triton
import triton.language as tl


@triton.jit
def _fp8_e4m3fn_bits(x):
    """The float8_e4m3fn bits of fp32 ``x`` (|x| <= 448 or NaN), rounded to nearest even.

    Integer arithmetic, for the interpreter: Triton 3.6's interpreter rounds fp32 -> fp8
    casts without carrying into the exponent (1.94 becomes 1.0) and without saturating.
    Subnormals (|x| < 2^-6) are rounded by an fp32 add of 2^14, whose ulp is 2^-9, the
    fp8 subnormal step; normals get the exponent rebiased (127 -> 7) and the 23-bit
    mantissa rounded to 3 bits, ties to even, with the carry running into the exponent.
    """
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    sub = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - 0x46800000
    odd = (a >> 20) & 1
    nrm = (a + (((7 - 127) << 23) + 0x7FFFF) + odd) >> 20
    out = tl.where(a < 0x3C800000, sub, nrm)  # 0x3C800000: 2^-6, the smallest fp8 normal
    out = tl.where(a > 0x7F800000, 0x7F, out)  # NaN stays NaN
    return (out | sign).to(tl.uint8)


@triton.jit
def _div_by(y, scale, inv):
    """``y / scale`` rounded as IEEE fp32 division where it is below 512 in magnitude (and
    at least 512 beyond), from ``inv = RN(1 / scale)``: the product ``q0 = RN(y * inv)`` is
    within an ulp of the quotient and one residual correction ``RN(q0 + RN(y - q0 * scale) *
    inv)`` (both fused) rounds it correctly (Markstein), with no per-value division and no
    branch. ``q0`` is first clamped to +-512 (NaN kept), so the residual stays finite where
    the product overflows and a quotient at or beyond 512 stays there (it saturates either
    way); the result takes ``q0``'s sign (the quotient's: a zero keeps its sign). Where the
    residual would underflow (``|y|`` below ~2^-100) the result may differ in its last fp32
    bit, in a quotient no fp8 value can show. Checked against the division by exact
    emulation (``tools/check_fp8_division.py``) and on the GPU."""
    q0 = tl.clamp(y * inv, -512.0, 512.0, propagate_nan=tl.PropagateNan.ALL)
    q = tl.fma(tl.fma(q0, -scale, y), inv, q0)  # -scale: one negation per program
    bits = (q.to(tl.int32, bitcast=True) & 0x7FFFFFFF) | (q0.to(tl.int32, bitcast=True)
                                                         & -0x80000000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _rcp(s, ASM: tl.constexpr):
    """``RN(1 / s)`` for a normal ``s``: with ``ASM`` (NVIDIA) the steps ``div.rn.f32``
    takes for ``1 / s`` on its fast path (the MUFU approximation, then two fused
    corrections) without its range check and out-of-line slow path, which ``s`` in
    [2^-85, 2^64] never needs (``tests/gpu/test_kv_write_fp8_gpu.py`` compares it with the
    division for every such fp32 value); else the division itself."""
    if ASM:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [s],
                                      dtype=tl.float32, is_pure=True, pack=1)
        r = tl.fma(r, tl.fma(-s, r, 1.0), r)
        return tl.fma(r, tl.fma(-s, r, 1.0), r)
    return tl.math.div_rn(1.0, s)


@triton.jit
def _scale_terms(scale, ASM: tl.constexpr):
    """The per-program terms of a division by ``scale`` without branches: ``(pre, sc,
    inv)`` with ``y / scale == (y * pre) / sc`` for every fp32 ``y`` an fp8 value can show
    the quotient of, ``sc = scale * pre`` in [2^-85, 2^64] (``pre`` a power of two: 2^64
    below 2^-64, 2^-64 above 2^64, else 1) or 0, +-2^64 (an infinite scale) or NaN, and
    ``inv = RN(1 / sc)`` (+-inf for a zero scale, +-0 for an infinite one), so that
    :func:`_div_by` of ``y * pre`` gives IEEE division's fp8 bytes at every scale."""
    a = tl.abs(scale)
    pre = tl.where(a < 5.421010862427522e-20, 1.8446744073709552e19,
                   tl.where(a > 1.8446744073709552e19, 5.421010862427522e-20, 1.0))
    sc = scale * pre
    sign = sc.to(tl.int32, bitcast=True) & -0x80000000
    inv = _rcp(sc, ASM)
    inv = tl.where(a == 0.0, (sign | 0x7F800000).to(tl.float32, bitcast=True), inv)
    inv = tl.where(a == float("inf"), sign.to(tl.float32, bitcast=True), inv)
    sc = tl.where(a == float("inf"), (sign | 0x5F800000).to(tl.float32, bitcast=True), sc)
    return pre, sc, inv


@triton.jit
def _quantize(x, scale, pre, inv, OUT_TY: tl.constexpr, SCALED: tl.constexpr,
              FP8_MAX: tl.constexpr, SOFT_FP8: tl.constexpr, FAST_DIV: tl.constexpr,
              NVIDIA: tl.constexpr):
    """``x / scale`` in fp32 (IEEE division), saturated to +-FP8_MAX, rounded to fp8.

    With ``FAST_DIV`` (a GPU) ``scale``, ``pre`` and ``inv`` are :func:`_scale_terms`' and
    the division is :func:`_div_by` of ``x * pre``: straight-line code, no per-value
    division; else (the interpreter, whose fma rounds twice) a per-value division. On
    ``NVIDIA`` the cast saturates by itself (``cvt.rn.satfinite``: +-448, NaN kept)."""
    y = x.to(tl.float32)
    if SCALED:
        if FAST_DIV:
            y = _div_by(y * pre, scale, inv)
        else:
            y = tl.math.div_rn(y, scale)
    if not NVIDIA:
        y = tl.clamp(y, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    if SOFT_FP8:
        return _fp8_e4m3fn_bits(y).to(OUT_TY, bitcast=True)
    return y.to(OUT_TY, fp_downcast_rounding="rtne")


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, mask_ptr, active_ptr, ks_ptr, vs_ptr,
    num_tokens, num_slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcp, stride_kch,
    stride_vcb, stride_vcp, stride_vch,
    stride_slot, stride_mask,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_ACTIVE: tl.constexpr, USE_PDL: tl.constexpr,
    QUANT: tl.constexpr, SCALED: tl.constexpr, FP8_MAX: tl.constexpr, SOFT_FP8: tl.constexpr,
    FAST_DIV: tl.constexpr, NVIDIA: tl.constexpr,
):
    """One program copies BLOCK_T rows x BLOCK_H heads of K and of V into the cache.

    The (row, head) pairs are flattened into the first tile axis, the head dim is the
    second (contiguous) one. K/V are loaded without waiting for the slot, so the slot and
    data loads overlap; only the stores depend on the slot. With ``USE_PDL`` it waits for
    the previous grid before touching memory and then lets the next grid launch.
    With ``QUANT`` (an fp8 cache) each value is stored as ``x / scale`` rounded to fp8,
    saturating (the scales are read here, so a captured graph sees new scales).
    """
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    t = (pid_t * BLOCK_T + r // BLOCK_H).to(tl.int64)
    h = (pid_h * BLOCK_H + r % BLOCK_H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)

    in_range = t < num_tokens
    if NUM_HEADS % BLOCK_H != 0:
        in_range = in_range & (h < NUM_HEADS)
    if HEAD_DIM == BLOCK_D:
        ld_mask = in_range[:, None]
    else:
        ld_mask = in_range[:, None] & (d[None, :] < HEAD_DIM)

    k = tl.load(k_ptr + (t * stride_kt + h * stride_kh)[:, None] + d[None, :], mask=ld_mask)
    v = tl.load(v_ptr + (t * stride_vt + h * stride_vh)[:, None] + d[None, :], mask=ld_mask)

    slot = tl.load(slot_ptr + t * stride_slot, mask=in_range, other=-1).to(tl.int64)
    # slots outside [0, num_slots) skip the row: a bad slot never writes outside the cache
    write = in_range & (slot >= 0) & (slot < num_slots)
    if HAS_MASK:
        keep = tl.load(mask_ptr + t * stride_mask, mask=in_range, other=0)
        write = write & (keep != 0)
    if HAS_ACTIVE:
        n_active = tl.load(active_ptr)
        write = write & (t < n_active)
    slot = tl.where(write, slot, 0)
    blk = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    if HEAD_DIM == BLOCK_D:
        st_mask = write[:, None]
    else:
        st_mask = write[:, None] & (d[None, :] < HEAD_DIM)
    if QUANT:
        k_scale = 1.0
        v_scale = 1.0
        k_pre = 1.0
        v_pre = 1.0
        k_inv = 1.0
        v_inv = 1.0
        if SCALED:
            k_scale = tl.load(ks_ptr)
            v_scale = tl.load(vs_ptr)
            if FAST_DIV:  # one reciprocal per program, not one division per value
                k_pre, k_scale, k_inv = _scale_terms(k_scale, NVIDIA)
                v_pre, v_scale, v_inv = _scale_terms(v_scale, NVIDIA)
        k = _quantize(k, k_scale, k_pre, k_inv, kc_ptr.dtype.element_ty, SCALED, FP8_MAX,
                      SOFT_FP8, FAST_DIV, NVIDIA)
        v = _quantize(v, v_scale, v_pre, v_inv, vc_ptr.dtype.element_ty, SCALED, FP8_MAX,
                      SOFT_FP8, FAST_DIV, NVIDIA)

    kc_off = blk * stride_kcb + off * stride_kcp + h * stride_kch
    vc_off = blk * stride_vcb + off * stride_vcp + h * stride_vch
    tl.store(kc_ptr + kc_off[:, None] + d[None, :], k, mask=st_mask)
    tl.store(vc_ptr + vc_off[:, None] + d[None, :], v, mask=st_mask)
