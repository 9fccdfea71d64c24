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
    """``y / scale`` rounded as IEEE fp32 division, from ``inv = RN(1 / scale)``: the product
    ``q0 = RN(y * inv)`` is within an ulp of the quotient and one residual correction
    ``RN(q0 + RN(y - q0 * scale) * inv)`` (both fused) rounds it correctly (Markstein), with
    no per-value division and its range-check branches. Where the residual would
    underflow (``|y|`` below ~2^-100) the result may differ in its last fp32 bit, in a
    quotient no fp8 value can show (it rounds to +-0 alike); at or beyond 512 the quotient
    saturates either way and ``q0`` is kept (the residual could overflow there). Checked
    against the division for every finite bf16 and fp16 value and for quotients beside
    every fp8 rounding midpoint (``tools/check_fp8_division.py``)."""
    q0 = y * inv
    e = tl.fma(-q0, scale, y)
    q = tl.where(e == 0.0, q0, tl.fma(e, inv, q0))  # e == 0: q0 is exact (and keeps -0)
    return tl.where(tl.abs(q0) < 512.0, q, q0)


@triton.jit
def _quantize(x, scale, inv, OUT_TY: tl.constexpr, SCALED: tl.constexpr,
              FP8_MAX: tl.constexpr, SOFT_FP8: tl.constexpr, FAST_DIV: tl.constexpr):
    """``x / scale`` in fp32 (IEEE division), saturated to +-FP8_MAX, rounded to fp8.

    With ``FAST_DIV`` (a GPU) the division is :func:`_div_by` when ``inv`` is finite and
    normal (any scale between 2^-125 and 2^125 in magnitude), a per-value division
    otherwise."""
    y = x.to(tl.float32)
    if SCALED:
        if FAST_DIV:
            if (tl.abs(scale) >= 2.350988701644575e-38) & (tl.abs(scale) <= 4.253529586511731e+37):
                y = _div_by(y, scale, inv)
            else:
                y = tl.math.div_rn(y, scale)
        else:
            y = tl.math.div_rn(y, scale)
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
    FAST_DIV: tl.constexpr,
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
        k_inv = 1.0
        v_inv = 1.0
        if SCALED:
            k_scale = tl.load(ks_ptr)
            v_scale = tl.load(vs_ptr)
            if FAST_DIV:  # one division per program, not one per value
                k_inv = tl.math.div_rn(1.0, k_scale)
                v_inv = tl.math.div_rn(1.0, v_scale)
        k = _quantize(k, k_scale, k_inv, kc_ptr.dtype.element_ty, SCALED, FP8_MAX, SOFT_FP8,
                      FAST_DIV)
        v = _quantize(v, v_scale, v_inv, vc_ptr.dtype.element_ty, SCALED, FP8_MAX, SOFT_FP8,
                      FAST_DIV)

    kc_off = blk * stride_kcb + off * stride_kcp + h * stride_kch
    vc_off = blk * stride_vcb + off * stride_vcp + h * stride_vch
    tl.store(kc_ptr + kc_off[:, None] + d[None, :], k, mask=st_mask)
    tl.store(vc_ptr + vc_off[:, None] + d[None, :], v, mask=st_mask)
