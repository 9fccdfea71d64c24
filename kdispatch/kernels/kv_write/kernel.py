"""The fused K+V paged-cache writer kernel of ``kv_write``."""

import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, mask_ptr, active_ptr,
    num_tokens, num_slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcp, stride_kch,
    stride_vcb, stride_vcp, stride_vch,
    stride_slot, stride_mask,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_ACTIVE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One program copies BLOCK_T rows x BLOCK_H heads of K and of V into the cache.

    The (row, head) pairs are flattened into the first tile axis, the head dim is the
    second (contiguous) one. K/V are loaded without waiting for the slot, so the slot and
    data loads overlap; only the stores depend on the slot. With ``USE_PDL`` it waits for
    the previous grid before touching memory and then lets the next grid launch.
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

    kc_off = blk * stride_kcb + off * stride_kcp + h * stride_kch
    vc_off = blk * stride_vcb + off * stride_vcp + h * stride_vch
    tl.store(kc_ptr + kc_off[:, None] + d[None, :], k, mask=st_mask)
    tl.store(vc_ptr + vc_off[:, None] + d[None, :], v, mask=st_mask)
