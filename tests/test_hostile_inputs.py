"""Property-based: random shapes, dtypes, strides and malformed arguments thrown at the ops.

Each call either computes the right answer (checked against an independent fp32 reference
written here) or raises a ValueError that names the offending argument. The caches live in
the middle of larger buffers whose guard regions must come back bit-identical, so a write
outside the cache is caught.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kdispatch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GUARD = 64
SETTINGS = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def guarded(shape, dtype, gen):
    """A random tensor of ``shape`` inside a buffer with random guard regions."""
    n = math.prod(shape)
    buf = torch.randn(n + 2 * GUARD, generator=gen).to(dtype)
    return buf, buf[GUARD:GUARD + n].view(shape)


# -- write_kv -----------------------------------------------------------------------------------
KV_FAULTS = ["value_shape", "value_dtype", "cache_rank", "cache_heads",
             "vcache_shape", "slot_dtype", "slot_len", "noncontig_last", "mask_dtype",
             "mask_len", "active_dtype", "active_shape", "not_tensor", "cache_dtype"]
KV_ARG = {"value_shape": "value", "value_dtype": "value", "cache_rank": "key_cache",
          "cache_heads": "key_cache", "vcache_shape": "value_cache",
          "slot_dtype": "slot_mapping", "slot_len": "slot_mapping", "noncontig_last": "key",
          "mask_dtype": "row_mask", "mask_len": "row_mask", "active_dtype": "active_rows",
          "active_shape": "active_rows", "not_tensor": "value", "cache_dtype": "key_cache"}


@st.composite
def kv_cases(draw):
    c = dict(T=draw(st.integers(1, 20)), H=draw(st.integers(1, 4)),
             D=draw(st.sampled_from([1, 2, 8, 16, 24, 64])), page=draw(st.sampled_from([1, 3, 16])),
             nb=draw(st.integers(1, 5)), dtype=draw(st.sampled_from(DTYPES)),
             strided=draw(st.booleans()), mask=draw(st.booleans()),
             active=draw(st.booleans()),
             fault=draw(st.one_of(st.none(), st.sampled_from(KV_FAULTS))),
             seed=draw(st.integers(0, 2**16)))
    cap = c["nb"] * c["page"]
    # unique in-range slots (duplicates are a race by contract), plus negative / past-the-end
    valid = draw(st.lists(st.integers(0, cap - 1), unique=True, max_size=c["T"]))
    extra = draw(st.lists(st.sampled_from([-1, -7, cap, cap + 5]), min_size=c["T"] - len(valid),
                          max_size=c["T"] - len(valid)))
    c["slots"] = draw(st.permutations(valid + extra))
    c["active_n"] = draw(st.integers(-1, c["T"] + 2))
    return c


def kv_reference(c, k, v, kc, vc, slots, mask):
    kc, vc = kc.clone(), vc.clone()
    cap = c["nb"] * c["page"]
    for t, s in enumerate(slots):
        if s < 0 or s >= cap or (mask is not None and not mask[t]):
            continue
        if c["active"] and t >= c["active_n"]:
            continue
        kc[s // c["page"], s % c["page"]] = k[t]
        vc[s // c["page"], s % c["page"]] = v[t]
    return kc, vc


@SETTINGS
@given(kv_cases())
def test_write_kv_hostile(c):
    gen = torch.Generator().manual_seed(c["seed"])
    T, H, D, dtype = c["T"], c["H"], c["D"], c["dtype"]
    if c["strided"]:
        qkv = torch.randn(T, 3 * H * D + 5, generator=gen).to(dtype)
        k = qkv[:, 5:5 + H * D].view(T, H, D)
        v = qkv[:, 5 + 2 * H * D:5 + 3 * H * D].view(T, H, D)
    else:
        k = torch.randn(T, H, D, generator=gen).to(dtype)
        v = torch.randn(T, H, D, generator=gen).to(dtype)
    shape = (c["nb"], c["page"], H, D)
    kbuf, kc = guarded(shape, dtype, gen)
    vbuf, vc = guarded(shape, dtype, gen)
    slots = torch.tensor(c["slots"], dtype=torch.int64)
    mask = torch.rand(T, generator=gen) > 0.3 if c["mask"] else None
    active = torch.tensor([c["active_n"]], dtype=torch.int32) if c["active"] else None
    expect_k, expect_v = kv_reference(c, k.float(), v.float(), kc.float(), vc.float(),
                                      c["slots"], mask)
    kbuf0, vbuf0 = kbuf.clone(), vbuf.clone()

    args = dict(key=k, value=v, key_cache=kc, value_cache=vc, slot_mapping=slots,
                row_mask=mask, active_rows=active)
    f = c["fault"]
    if f == "value_shape":
        args["value"] = torch.randn(T, H, D + 1).to(dtype)
    elif f == "value_dtype":
        args["value"] = v.to(torch.float32 if dtype != torch.float32 else torch.float16)
    elif f == "cache_rank":
        args["key_cache"] = kc.view(c["nb"] * c["page"], H, D)
    elif f == "cache_heads":
        args["key_cache"] = torch.randn(c["nb"], c["page"], H + 1, D).to(dtype)
    elif f == "vcache_shape":
        args["value_cache"] = torch.randn(c["nb"] + 1, c["page"], H, D).to(dtype)
    elif f == "cache_dtype":
        args["key_cache"] = kc.to(torch.float32 if dtype != torch.float32 else torch.float16)
    elif f == "slot_dtype":
        args["slot_mapping"] = slots.float()
    elif f == "slot_len":
        args["slot_mapping"] = torch.zeros(T + 1, dtype=torch.int64)
    elif f == "noncontig_last":
        if D == 1:
            f = None  # a last dim of one element is contiguous by definition
        else:
            args["key"] = torch.randn(T, H, D, 2).to(dtype)[..., 0]
    elif f == "mask_dtype":
        args["row_mask"] = torch.ones(T, dtype=torch.int32)
    elif f == "mask_len":
        args["row_mask"] = torch.ones(T + 2, dtype=torch.bool)
    elif f == "active_dtype":
        args["active_rows"] = torch.tensor([1.0])
    elif f == "active_shape":
        args["active_rows"] = torch.tensor([1, 2], dtype=torch.int32)
    elif f == "not_tensor":
        args["value"] = [[1.0]]

    if f is not None:
        with pytest.raises(ValueError, match=KV_ARG[f]):
            kdispatch.write_kv(**args)
        event("write_kv: rejected")
    else:
        kdispatch.write_kv(**args)
        torch.testing.assert_close(kc.float(), expect_k, rtol=0, atol=0)
        torch.testing.assert_close(vc.float(), expect_v, rtol=0, atol=0)
        event("write_kv: computed")
    assert torch.equal(kbuf[:GUARD], kbuf0[:GUARD]) and torch.equal(kbuf[-GUARD:], kbuf0[-GUARD:])
    assert torch.equal(vbuf[:GUARD], vbuf0[:GUARD]) and torch.equal(vbuf[-GUARD:], vbuf0[-GUARD:])


# -- decode_attention ----------------------------------------------------------------------------
DEC_FAULTS = ["q_rank", "q_dtype", "heads_divide", "bt_dtype", "bt_rank",
              "k_rank", "v_heads", "seq_len_shape", "seq_dtype", "kv_dtype", "out_shape"]
DEC_ARG = {"q_rank": "q", "q_dtype": "q", "heads_divide": "q", "bt_dtype": "block_table",
           "bt_rank": "block_table", "k_rank": "k_cache", "v_heads": "v_cache",
           "seq_len_shape": "seq_lens", "seq_dtype": "seq_lens", "kv_dtype": "k_cache",
           "out_shape": "out"}


@st.composite
def decode_cases(draw):
    c = dict(B=draw(st.integers(1, 3)), Hk=draw(st.integers(1, 2)),
             group=draw(st.sampled_from([1, 2, 3, 4])), D=draw(st.sampled_from([16, 32, 64])),
             page=draw(st.sampled_from([1, 4, 16])), pages=draw(st.integers(1, 4)),
             dtype=draw(st.sampled_from(DTYPES)), window=draw(st.sampled_from([None, 1, 5, 40])),
             cap=draw(st.sampled_from([0.0, 0.0, 20.0])),
             fault=draw(st.one_of(st.none(), st.sampled_from(DEC_FAULTS))),
             seed=draw(st.integers(0, 2**16)))
    capacity = c["pages"] * c["page"]
    # lengths past the page table's capacity (and 0, negative) are clamped by contract
    c["lens"] = draw(st.lists(st.integers(-2, capacity + 40), min_size=c["B"], max_size=c["B"]))
    return c


def decode_reference(q, k_cache, v_cache, block_table, lens, scale, window, cap):
    B, Hq, _ = q.shape
    Hk, page = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty(B, Hq, v_cache.shape[-1])
    capacity = block_table.shape[1] * page
    for b in range(B):
        n = min(max(lens[b], 0), capacity)
        if n == 0:
            out[b] = 0.0
            continue
        lo = max(n - window, 0) if window else 0
        pos = torch.arange(lo, n)
        pages = block_table[b, pos // page].long()
        k = k_cache[pages, pos % page].float()   # [n, Hk, D]
        v = v_cache[pages, pos % page].float()
        for h in range(Hq):
            kh = h // (Hq // Hk)
            s = (k[:, kh] @ q[b, h].float()) * scale
            if cap:
                s = cap * torch.tanh(s / cap)
            out[b, h] = torch.softmax(s, 0) @ v[:, kh]
    return out


@SETTINGS
@given(decode_cases())
def test_decode_attention_hostile(c):
    gen = torch.Generator().manual_seed(c["seed"])
    B, Hk, D, dtype, page = c["B"], c["Hk"], c["D"], c["dtype"], c["page"]
    Hq = Hk * c["group"]
    nb = B * c["pages"] + 1
    q = torch.randn(B, Hq, D, generator=gen).to(dtype)
    kbuf, kc = guarded((nb, page, Hk, D), dtype, gen)
    vbuf, vc = guarded((nb, page, Hk, D), dtype, gen)
    bt = torch.randperm(nb, generator=gen)[:B * c["pages"]].to(torch.int32).view(B, c["pages"])
    lens = torch.tensor(c["lens"], dtype=torch.int32)
    kbuf0, vbuf0 = kbuf.clone(), vbuf.clone()
    args = dict(q=q, k_cache=kc, v_cache=vc, block_table=bt, seq_lens=lens)
    kw = dict(scale=D ** -0.5, sliding_window=c["window"], logit_cap=c["cap"])
    f = c["fault"]
    if f == "q_rank":
        args["q"] = q.view(B, Hq * D)
    elif f == "q_dtype":
        args["q"] = q.to(torch.int32)
    elif f == "heads_divide":
        if Hk == 1:
            f = None  # every head count divides by one kv head
        else:
            args["q"] = torch.randn(B, Hq + 1, D).to(dtype)
    elif f == "bt_dtype":
        args["block_table"] = bt.long()
    elif f == "bt_rank":
        args["block_table"] = bt.view(-1)
    elif f == "k_rank":
        args["k_cache"] = kc.view(nb * page, Hk, D)
    elif f == "v_heads":
        args["v_cache"] = torch.randn(nb, page, Hk + 1, D).to(dtype)
    elif f == "seq_len_shape":
        args["seq_lens"] = torch.ones(B + 1, dtype=torch.int32)
    elif f == "seq_dtype":
        args["seq_lens"] = lens.float()
    elif f == "kv_dtype":
        args["k_cache"] = kc.to(torch.float32 if dtype != torch.float32 else torch.float16)
    elif f == "out_shape":
        kw["out"] = torch.empty(B, Hq, D + 1, dtype=dtype)

    if f is not None:
        with pytest.raises(ValueError, match=DEC_ARG[f]):
            kdispatch.decode_attention(**args, **kw)
        event("decode_attention: rejected")
    else:
        out = kdispatch.decode_attention(**args, **kw)
        ref = decode_reference(q, kc, vc, bt, c["lens"], kw["scale"], c["window"], c["cap"])
        tol = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2}[dtype]
        assert out.shape == (B, Hq, D) and out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
        event("decode_attention: computed")
    assert torch.equal(kbuf, kbuf0) and torch.equal(vbuf, vbuf0)  # caches are read-only
