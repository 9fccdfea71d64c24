"""decode_attention kernels against the fp32 reference (interpreter on CPU, or the GPU)."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels.decode_attention import (
    DecodeConfig, launch_decode_attention, reference_decode_attention, shares_latent,
)

TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (5e-3, 5e-3), torch.bfloat16: (2e-2, 2e-2)}


def make_case(dev, *, batch=3, hq=8, hk=2, dk=64, dv=None, page=16, pages=6,
              dtype=torch.float32, latent=False, seed=0, lens=None):
    """Random q/caches with a permuted page table; MLA latent if ``latent``."""
    dv = dv or dk
    g = torch.Generator().manual_seed(seed)
    nb = batch * pages + 3
    q = torch.randn(batch, hq, dk, generator=g).to(dev, dtype)
    k = torch.randn(nb, page, hk, dk, generator=g).to(dev, dtype)
    v = k[..., :dv] if latent else torch.randn(nb, page, hk, dv, generator=g).to(dev, dtype)
    bt = torch.randperm(nb, generator=g)[:batch * pages].view(batch, pages).to(torch.int32)
    if lens is None:
        lens = torch.randint(1, pages * page + 1, (batch,), generator=g).tolist()
    sl = torch.tensor(lens, dtype=torch.int32)
    return q, k, v, bt.to(dev), sl.to(dev)


def check(out, q, k, v, bt, sl, *, scale, **kw):
    ref = reference_decode_attention(q, k, v, bt, sl, scale=scale, **kw)
    atol, rtol = TOL[q.dtype]
    assert out.dtype == q.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)


def cfg(splits=1, block_n=32, block_h=16, **kw):
    return DecodeConfig(num_kv_splits=splits, block_n=block_n, block_h=block_h, **kw)


def test_ragged_lengths_around_page_and_block_boundaries(dev):
    lens = [1, 15, 16, 17, 63, 64, 65, 96]
    q, k, v, bt, sl = make_case(dev, batch=len(lens), pages=6, lens=lens)
    for splits in (1, 3):
        out = launch_decode_attention(cfg(splits), q, k, v, bt, sl, scale=0.125)
        check(out, q, k, v, bt, sl, scale=0.125)


@pytest.mark.parametrize("hq,hk", [(4, 4), (8, 2), (16, 2), (24, 1)])
def test_gqa_groups(dev, hq, hk):
    # group sizes 1, 4, 8; 24 heads on one kv head is not a multiple of block_h=16
    q, k, v, bt, sl = make_case(dev, hq=hq, hk=hk, pages=4, seed=hq)
    out = launch_decode_attention(cfg(2), q, k, v, bt, sl, scale=0.125)
    check(out, q, k, v, bt, sl, scale=0.125)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes(dev, dtype):
    q, k, v, bt, sl = make_case(dev, dtype=dtype, dk=128, hq=4, hk=1, pages=4, seed=7)
    for splits in (1, 4):
        out = launch_decode_attention(cfg(splits), q, k, v, bt, sl, scale=128 ** -0.5)
        check(out, q, k, v, bt, sl, scale=128 ** -0.5)


def test_mla_shared_latent(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, hq=4, hk=1, dk=576, dv=512, pages=2,
                                dtype=torch.bfloat16, latent=True, lens=[17, 32])
    assert shares_latent(k, v)
    scale = 576 ** -0.5
    for splits in (1, 2):
        out = launch_decode_attention(cfg(splits, block_n=16), q, k, v, bt, sl, scale=scale)
        check(out, q, k, v, bt, sl, scale=scale)
    # a separate (non-aliased) V tensor is read on its own and gives the same answer
    v2 = v.contiguous()
    assert not shares_latent(k, v2)
    out2 = launch_decode_attention(cfg(2, block_n=16), q, k, v2, bt, sl, scale=scale)
    check(out2, q, k, v2, bt, sl, scale=scale)
    # and a V that is not K's first columns is not mistaken for the latent
    v3 = torch.flip(v2, dims=[-1])
    out3 = launch_decode_attention(cfg(1, block_n=16), q, k, v3, bt, sl, scale=scale)
    check(out3, q, k, v3, bt, sl, scale=scale)



@pytest.mark.parametrize("hq,hk,window,logit_cap", [(12, 1, None, 0.0), (12, 1, 20, 0.0),
                                                     (6, 2, None, 5.0), (20, 1, 9, 3.0)])
def test_mla_latent_halves_kernel(dev, hq, hk, window, logit_cap):
    # Dv 512 shared latent runs _decode_stage1_latent (two half-width tiles): sliding
    # window, logit cap, several kv heads, > 16 heads (two head blocks), direct and split,
    # and a zero-length request
    from kdispatch.kernels.decode_attention import launch as da
    assert da.SPLIT_LATENT_MIN_DV <= 512
    q, k, v, bt, sl = make_case(dev, batch=3, hq=hq, hk=hk, dk=576, dv=512, pages=3,
                                dtype=torch.bfloat16, latent=True, lens=[37, 0, 48],
                                seed=hq + hk)
    assert shares_latent(k, v)
    scale = 576 ** -0.5
    kw = dict(sliding_window=window, logit_cap=logit_cap)
    for splits in (1, 3):
        out = launch_decode_attention(cfg(splits, block_n=16), q, k, v, bt, sl, scale=scale,
                                      **kw)
        check(out, q, k, v, bt, sl, scale=scale, **kw)
        assert out[1].abs().max().item() == 0.0

def test_reduce_launch_shape_rule():
    # one warp over up to 128 columns; four warps over 512 from 64 heads on; never from
    # the batch (measured: docs/decode_notes.md v6)
    from kdispatch.kernels.decode_attention.launch import reduce_shape as _reduce_shape
    assert _reduce_shape(16, 512) == (128, 1)
    assert _reduce_shape(12, 512) == (128, 1)
    assert _reduce_shape(32, 128) == (128, 1)
    assert _reduce_shape(16, 64) == (64, 1)
    assert _reduce_shape(64, 512) == (512, 4)
    assert _reduce_shape(128, 512) == (512, 4)
    assert _reduce_shape(128, 96) == (128, 1)


def test_reduce_with_many_heads(dev):
    # 64 q heads at Dv 512: the reduce's four-warp, 512-column shape; ragged lengths
    # across page and tile edges
    lens = [1, 15, 16, 17, 31, 32, 33, 48]
    q, k, v, bt, sl = make_case(dev, batch=8, hq=64, hk=8, dk=512, pages=3, lens=lens,
                                seed=11)
    out = launch_decode_attention(cfg(3, block_n=16), q, k, v, bt, sl,
                                  scale=512 ** -0.5)
    check(out, q, k, v, bt, sl, scale=512 ** -0.5)


def test_split_counts_agree(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=8, lens=[128, 77], seed=3)
    outs = [launch_decode_attention(cfg(s, block_n=16), q, k, v, bt, sl, scale=0.125)
            for s in (1, 2, 5, 8, 64)]
    for out in outs:
        check(out, q, k, v, bt, sl, scale=0.125)
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


def test_capacity_far_above_live_length(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=64, lens=[3, 40], seed=4)
    for splits in (1, 16):
        out = launch_decode_attention(cfg(splits), q, k, v, bt, sl, scale=0.125)
        check(out, q, k, v, bt, sl, scale=0.125)


@pytest.mark.parametrize("window,cap", [(20, 0.0), (None, 2.0), (33, 1.5)])
def test_sliding_window_and_logit_cap(dev, window, cap):
    q, k, v, bt, sl = make_case(dev, pages=6, lens=[1, 19, 96], seed=5)
    q = q * 3  # large scores, so the cap bites
    for splits in (1, 3):
        out = launch_decode_attention(cfg(splits), q, k, v, bt, sl, scale=0.125,
                                      sliding_window=window, logit_cap=cap)
        check(out, q, k, v, bt, sl, scale=0.125, sliding_window=window, logit_cap=cap)
    # the options change the answer (the test would notice if they were ignored)
    plain = reference_decode_attention(q, k, v, bt, sl, scale=0.125)
    assert not torch.allclose(out.float(), plain, atol=1e-3)


def test_zero_length_request_gives_zeros(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=2, lens=[0, 20])
    for splits in (1, 2):
        out = launch_decode_attention(cfg(splits), q, k, v, bt, sl, scale=0.125)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        check(out, q, k, v, bt, sl, scale=0.125)


def test_strided_inputs(dev):
    g = torch.Generator().manual_seed(9)
    b, hq, hk, d, page, pages = 2, 4, 2, 64, 16, 3
    nb = b * pages + 1
    kv = torch.randn(nb, page, 2, hk, d + 16, generator=g).to(dev)  # interleaved, padded
    k, v = kv[:, :, 0, :, :d], kv[:, :, 1, :, 8:8 + d]
    qkv = torch.randn(b, hq + 2 * hk, d, generator=g).to(dev)
    q = qkv[:, :hq]
    bt = torch.zeros(b, 2 * pages, dtype=torch.int32)
    bt[:, ::2] = torch.randperm(nb, generator=g)[:b * pages].view(b, pages).int()
    bt = bt.to(dev)[:, ::2]  # non-unit column stride
    sl = torch.tensor([48, 21], dtype=torch.int32, device=dev)
    assert not k.is_contiguous() and not q.is_contiguous() and bt.stride(1) == 2
    out = torch.empty(b, hq, 2 * d, device=dev)[..., :d]
    res = launch_decode_attention(cfg(2), q, k, v, bt, sl, scale=0.125, out=out)
    assert res.data_ptr() == out.data_ptr()
    check(out, q, k, v, bt, sl, scale=0.125)


def test_identical_bits_run_to_run(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=4, dtype=torch.bfloat16, seed=11)
    a = launch_decode_attention(cfg(3), q, k, v, bt, sl, scale=0.125)
    b = launch_decode_attention(cfg(3), q, k, v, bt, sl, scale=0.125)
    assert torch.equal(a, b)


def test_batch_invariance_bit_for_bit(dev):
    q, k, v, bt, sl = make_case(dev, batch=3, hq=4, hk=1, pages=64, lens=[300, 7, 512], seed=12)
    kw = dict(scale=0.125, batch_invariant=True)
    batched = kdispatch.decode_attention(q, k, v, bt, sl, **kw)
    alone = kdispatch.decode_attention(q[:1], k, v, bt[:1], sl[:1], **kw)
    assert torch.equal(batched[:1], alone)
    cfg_b = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                              seq_lens=sl, batch_invariant=True)
    cfg_a = kdispatch.resolve("decode_attention", q=q[:1], k_cache=k, v_cache=v,
                              block_table=bt[:1], seq_lens=sl[:1], batch_invariant=True)
    assert cfg_a == cfg_b and cfg_a.num_kv_splits > 1  # split path exercised
    check(batched, q, k, v, bt, sl, scale=0.125)


def test_public_call_resolves_and_matches(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=4, seed=13)
    out = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.125)
    check(out, q, k, v, bt, sl, scale=0.125)
    ex = kdispatch.explain("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                           seq_lens=sl)
    assert ex.key.context == 64 and ex.key.batch == 2


def _bad_inputs(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=2)
    good = dict(q=q, k_cache=k, v_cache=v, block_table=bt, seq_lens=sl)
    cases = [
        ("q", dict(q=q[0])),
        ("q", dict(q=q.to(torch.int32))),
        ("k_cache", dict(k_cache=k[0])),
        ("v_cache", dict(v_cache=v.half())),
        ("block_table", dict(block_table=bt.long())),
        ("block_table", dict(block_table=bt[0])),
        ("seq_lens", dict(seq_lens=sl.long())),
        ("seq_lens", dict(seq_lens=sl[:1])),
        ("q", dict(q=torch.randn(2, 7, 64, device=dev))),  # 7 heads on 2 kv heads
        ("k_cache", dict(q=torch.randn(2, 8, 32, device=dev))),  # head dim mismatch
        ("v_cache", dict(v_cache=torch.randn(*k.shape[:3], 128, device=dev))),  # Dv > Dk
        ("block_table", dict(block_table=bt[:1])),
        ("q", dict(q=q.transpose(1, 2).contiguous().transpose(1, 2))),  # last dim strided
    ]
    if dev.type == "cpu":
        cases.append(("k_cache", dict(k_cache=k.to("meta"))))
    return good, cases


def test_bad_inputs_name_the_argument(dev):
    good, cases = _bad_inputs(dev)
    for name, change in cases:
        args = {**good, **change}
        with pytest.raises(ValueError, match=name):
            launch_decode_attention(cfg(), **args, scale=0.1)
        with pytest.raises(ValueError, match=name):
            kdispatch.decode_attention(**args, scale=0.1)
    with pytest.raises(ValueError, match="sliding_window"):
        launch_decode_attention(cfg(), **good, scale=0.1, sliding_window=0)
    with pytest.raises(ValueError, match="out"):
        launch_decode_attention(cfg(), **good, scale=0.1,
                                out=torch.empty(2, 8, 32, device=good["q"].device))


@pytest.mark.parametrize("latent", [False, True], ids=["gqa", "mla"])
def test_pdl_config_matches_reference_or_is_refused(dev, latent):
    """pdl=True (reduce as a programmatic dependent launch): the same result as without on an
    sm_90+ GPU, over both stage-1 kernels; elsewhere a ValueError naming config."""
    from kdispatch.kernels._common import supports_pdl

    kw = dict(hq=4, hk=1, dk=576, dv=512, dtype=torch.bfloat16, latent=True) if latent \
        else dict(hq=8, hk=2, dk=64)
    q, k, v, bt, sl = make_case(dev, batch=3, pages=4, lens=[1, 17, 64], seed=11, **kw)
    c = cfg(3, pdl=True)
    if supports_pdl(q.device):
        out = launch_decode_attention(c, q, k, v, bt, sl, scale=0.125)
        check(out, q, k, v, bt, sl, scale=0.125)
        plain = launch_decode_attention(cfg(3), q, k, v, bt, sl, scale=0.125)
        assert torch.equal(out, plain)  # the same work in the same order: the same bits
    else:
        with pytest.raises(ValueError, match="^config: pdl=True needs"):
            launch_decode_attention(c, q, k, v, bt, sl, scale=0.125)


MERGE_CASES = {
    # the generic stage 1 (GQA, two kv heads), the generic stage 1 on a shared latent with a
    # narrow Dv, and the latent-halves kernel (Dv 512) with two head blocks (20 heads)
    "gqa": dict(hq=8, hk=2, dk=64),
    "mla-narrow": dict(hq=4, hk=1, dk=96, dv=64, latent=True),
    "mla-512": dict(hq=20, hk=1, dk=576, dv=512, latent=True, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", list(MERGE_CASES))
def test_merge_in_last_program_matches_reference(dev, case):
    """merge=True (no reduce kernel; the last stage-1 program of a request merges): ragged
    lengths around page and tile boundaries, empty trailing splits, a zero-length request,
    a sliding window; equal to the two-kernel result within rounding, the same bits run to
    run, and a repeat call (fresh arrival counters) gives the same bits again."""
    lens = [1, 15, 16, 17, 63, 64, 65, 0]
    q, k, v, bt, sl = make_case(dev, batch=len(lens), pages=5, lens=lens, seed=21,
                                **MERGE_CASES[case])
    scale = q.shape[-1] ** -0.5
    # empty trailing splits (8 splits over 5 pages) at the two narrow cases; the 576-wide
    # latent in the interpreter is the suite's slowest case, and its kernel merges alike
    runs = ((3, None), (5, 20)) if case == "mla-512" else ((3, None), (8, None), (5, 20))
    for splits, window in runs:
        kw = dict(sliding_window=window)
        merged = launch_decode_attention(cfg(splits, block_n=16, merge=True), q, k, v, bt, sl,
                                         scale=scale, **kw)
        check(merged, q, k, v, bt, sl, scale=scale, **kw)
        assert merged[-1].abs().max().item() == 0.0  # length 0: zeros
        two_kernel = launch_decode_attention(cfg(splits, block_n=16), q, k, v, bt, sl,
                                             scale=scale, **kw)
        atol = 1e-5 if q.dtype == torch.float32 else TOL[q.dtype][0]
        torch.testing.assert_close(merged.float(), two_kernel.float(), atol=atol, rtol=atol)
        again = launch_decode_attention(cfg(splits, block_n=16, merge=True), q, k, v, bt, sl,
                                        scale=scale, **kw)
        assert torch.equal(merged, again)


def test_merge_batch_invariant_bits(dev):
    q, k, v, bt, sl = make_case(dev, batch=3, hq=4, hk=1, pages=8, lens=[100, 7, 128], seed=22)
    c = cfg(4, block_n=16, merge=True)
    batched = launch_decode_attention(c, q, k, v, bt, sl, scale=0.125)
    alone = launch_decode_attention(c, q[1:2], k, v, bt[1:2], sl[1:2], scale=0.125)
    assert torch.equal(batched[1:2], alone)


def test_merge_with_pdl_is_refused(dev):
    q, k, v, bt, sl = make_case(dev, batch=2, pages=2)
    with pytest.raises(ValueError, match="^config: pdl and merge"):
        launch_decode_attention(cfg(2, pdl=True, merge=True), q, k, v, bt, sl, scale=0.1)
    # split count 1 writes the output directly: merge is moot and ignored
    out = launch_decode_attention(cfg(1, merge=True), q, k, v, bt, sl, scale=0.1)
    check(out, q, k, v, bt, sl, scale=0.1)
