"""fp8 caches and multi-token decode on the GPU: CUDA-graph capture replayed with changed
scales and lengths, batch invariance with several query tokens, the GPU's fp8 cast bit for
bit, and the writer and decoder in one captured graph.

Run on the device machine: ``python -m pytest -q -m gpu tests/gpu/test_fp8_mtp_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from graph_capture import capture
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.decode_attention import reference_decode_attention, spec
from kdispatch.kernels.kv_write import reference_kv_write

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
# fp16 dots over the dequantized fp8 cache, bf16 output: the bf16 tolerance (2^-8 per
# rounding of P and of the output, ~1e-2 on O(1) outputs)
TOL = 2e-2


def _close(out, ref):
    torch.testing.assert_close(out.float(), ref, atol=TOL, rtol=TOL)


def _capture(fn) -> torch.cuda.CUDAGraph:
    return capture(fn, forbid_sync=True)  # resolve + launch must not sync the host


def _fp8_cache(nb, page, hk, d, scale, gen):
    x = torch.randn(nb, page, hk, d, device="cuda", generator=gen)
    return quantize_fp8(x, scale, FP8)


@pytest.mark.parametrize("kind,q_len", [("mla", 1), ("mla", 2), ("gqa", 2), ("gqa", 1)])
def test_graph_replays_with_new_scales_lengths_and_tables(kind, q_len):
    """One captured decode over an fp8 cache, replayed with new scale values, lengths
    around page boundaries, page tables and queries: every replay matches the reference on
    the cache dequantized with the scales of that replay."""
    gen = torch.Generator(device="cuda").manual_seed(q_len)
    if kind == "mla":
        b, hq, hk, dk, dv, page, ctx = 8, 12, 1, 576, 512, 16, 65536
    else:
        b, hq, hk, dk, dv, page, ctx = 8, 32, 8, 128, 128, 16, 32768
    pages = ctx // page
    nb = b * pages + 5
    k_scale = torch.full((1,), 0.02, device="cuda")
    v_scale = k_scale if kind == "mla" else torch.full((1,), 0.03, device="cuda")
    k = _fp8_cache(nb, page, hk, dk, k_scale, gen)
    v = k[..., :dv] if kind == "mla" else _fp8_cache(nb, page, hk, dv, v_scale, gen)
    q_shape = (b, q_len, hq, dk) if q_len > 1 else (b, hq, dk)
    q = torch.randn(q_shape, device="cuda", generator=gen).bfloat16()
    bt = torch.randperm(nb, device="cuda", generator=gen)[:b * pages].view(b, pages).int()
    sl = torch.full((b,), 100, dtype=torch.int32, device="cuda")
    out = torch.empty((*q_shape[:-1], dv), device="cuda", dtype=torch.bfloat16)
    scale = dk ** -0.5
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl)
    if cfg.num_kv_splits == 1:  # a tuned table may not split: the test wants the partials
        cfg = cfg.model_copy(update={"num_kv_splits": 4})
    graph = _capture(lambda: kdispatch.decode_attention(
        q, k, v, bt, sl, scale=scale, out=out, k_scale=k_scale, v_scale=v_scale, config=cfg))
    ragged = [[1, 15, 16, 17, 63, 64, 65, ctx], [ctx - 1, ctx, 4097, 4096, 2, 3, 33, 1000]]
    for i, (lens, ks) in enumerate(zip(ragged * 2, (0.02, 0.05, 0.01, 0.5))):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        k_scale.fill_(ks)
        if kind != "mla":
            v_scale.fill_(ks * 1.5)
        if i >= 2:
            bt.copy_(torch.randperm(nb, device="cuda", generator=gen)[:b * pages].view(b, pages))
        q.normal_(generator=gen)
        graph.replay()
        torch.cuda.synchronize()
        _close(out, reference_decode_attention(q, k, v, bt, sl, scale=scale, k_scale=k_scale,
                                               v_scale=v_scale))


@pytest.mark.parametrize("q_len,fp8", [(2, False), (4, False), (2, True)])
def test_batch_invariant_bits_with_several_query_tokens(q_len, fp8):
    """A request's bits alone and in a batch of 40, several tokens per request, at > 32
    splits (reduce kernel) and at a split count that merges in stage 1."""
    gen = torch.Generator(device="cuda").manual_seed(q_len)
    b, hq, dk, dv, page, cap = 40, 16, 576, 512, 16, 65536
    nb = 2000  # pages may repeat across requests: reads only
    scales = {}
    if fp8:
        scales = {"k_scale": torch.full((1,), 0.02, device="cuda")}
        scales["v_scale"] = scales["k_scale"]
        k = _fp8_cache(nb, page, 1, dk, scales["k_scale"], gen)
    else:
        k = torch.randn(nb, page, 1, dk, device="cuda", generator=gen).bfloat16()
    v = k[..., :dv]
    q = torch.randn(b, q_len, hq, dk, device="cuda", generator=gen).bfloat16()
    bt = torch.randint(0, nb, (b, cap // page), device="cuda", dtype=torch.int32,
                       generator=gen)
    sl = torch.randint(3000, 6001, (b,), device="cuda", dtype=torch.int32, generator=gen)
    kw = dict(scale=dk ** -0.5, batch_invariant=True, **scales)
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl, batch_invariant=True)
    assert cfg.num_kv_splits > 1
    batched = kdispatch.decode_attention(q, k, v, bt, sl, **kw)
    for r in (0, 17, b - 1):
        alone = kdispatch.decode_attention(q[r:r + 1], k, v, bt[r:r + 1], sl[r:r + 1], **kw)
        assert torch.equal(batched[r:r + 1], alone), r
    _close(batched, reference_decode_attention(q, k, v, bt, sl, scale=dk ** -0.5, **scales))
    # the Triton latent tile (the heuristic may take the Gluon tile here) at both ways of
    # merging the splits
    key = kdispatch.explain("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl, batch_invariant=True).key
    bh = spec.default_block_h(key)
    bn, warps, stages = spec.latent_tile(key, bh)
    tile = spec.DecodeConfig(block_h=bh, block_n=bn, num_warps=warps, num_stages=stages)
    for splits, merge in ((48, False), (3, True)):
        c = tile.model_copy(update={"num_kv_splits": splits, "merge": merge})
        many = kdispatch.decode_attention(q, k, v, bt, sl, config=c, **kw)
        one = kdispatch.decode_attention(q[5:6], k, v, bt[5:6], sl[5:6], config=c, **kw)
        assert torch.equal(many[5:6], one), (splits, merge)


def test_gpu_fp8_cast_is_bit_exact():
    """The GPU's saturating fp32 -> e4m3 cast against torch's for every fp8 value, the
    midpoints (ties to even) and their neighbours, +-inf, NaN and out-of-range values."""
    allv = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    vals = allv[~allv.isnan()].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    x = torch.cat([vals, mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                   torch.nextafter(mids, torch.full_like(mids, -1e9)),
                   torch.tensor([1e9, -1e9, 464.0, 465.0, float("inf"), -float("inf"),
                                 float("nan"), -0.0])])
    x = torch.cat([x, torch.ones(-x.numel() % 128)]).view(-1, 1, 128).cuda()
    rows = x.shape[0]
    cache = torch.zeros(rows, 1, 1, 128, dtype=FP8, device="cuda")
    vcache = torch.zeros_like(cache)
    scale = torch.full((1,), 0.5, device="cuda")
    kdispatch.write_kv(x, -x, cache, vcache, torch.arange(rows, device="cuda"),
                       k_scale=scale, v_scale=scale)
    torch.cuda.synchronize()
    want = quantize_fp8(x, scale, FP8).view(torch.uint8)
    assert torch.equal(cache.view(rows, 1, 128).view(torch.uint8), want)
    assert torch.equal(vcache.view(rows, 1, 128).view(torch.uint8),
                       quantize_fp8(-x, scale, FP8).view(torch.uint8))


def test_write_then_decode_in_one_graph_with_new_scales():
    """A two-token step as an engine captures it: write both tokens' fp8 K/V (quantized
    with the current scales), then decode both tokens; replayed with new values, slots
    behind new lengths and new scales."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    b, q_len, hq, hk, d, page, pages = 4, 2, 32, 8, 128, 16, 64
    nb = b * pages + 1
    k_scale = torch.full((1,), 0.02, device="cuda")
    v_scale = torch.full((1,), 0.03, device="cuda")
    kc = _fp8_cache(nb, page, hk, d, k_scale, gen)
    vc = _fp8_cache(nb, page, hk, d, v_scale, gen)
    bt = torch.randperm(nb, device="cuda", generator=gen)[:b * pages].view(b, pages).int()
    sl = torch.tensor([2, 17, 64, 1000], dtype=torch.int32, device="cuda")
    qkv = torch.randn(b * q_len, (hq + 2 * hk) * d, device="cuda", generator=gen).bfloat16()
    q, key, value = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    key, value = key.view(b * q_len, hk, d), value.view(b * q_len, hk, d)
    slots = torch.empty(b * q_len, dtype=torch.int64, device="cuda")
    out = torch.empty(b, q_len, hq, d, device="cuda", dtype=torch.bfloat16)

    def set_slots():  # the new tokens are the last q_len of each request
        pos = sl.long()[:, None] - q_len + torch.arange(q_len, device="cuda")[None, :]
        slots.copy_((bt.long().gather(1, pos // page) * page + pos % page).flatten())

    set_slots()

    def step():
        kdispatch.write_kv(key, value, kc, vc, slots, k_scale=k_scale, v_scale=v_scale)
        kdispatch.decode_attention(q.view(b, q_len, hq, d), kc, vc, bt, sl, scale=d ** -0.5,
                                   out=out, k_scale=k_scale, v_scale=v_scale)

    graph = _capture(step)
    for i, lens in enumerate(([2, 17, 64, 1000], [16, 15, 1024, 65], [33, 2, 3, 512])):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        set_slots()
        qkv.normal_(generator=gen)
        k_scale.fill_(0.02 * (i + 1))
        before_k, before_v = kc.clone(), vc.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref_k, ref_v = reference_kv_write(key, value, before_k, before_v, slots,
                                          k_scale=k_scale, v_scale=v_scale)
        assert torch.equal(kc.float(), ref_k) and torch.equal(vc.float(), ref_v)
        _close(out, reference_decode_attention(q.view(b, q_len, hq, d), kc, vc, bt, sl,
                                               scale=d ** -0.5, k_scale=k_scale,
                                               v_scale=v_scale))
