"""Multi-token decode (q ``[B, Q, Hq, Dk]``, speculative decoding / MTP) against the fp32
reference: token ``i`` of ``Q`` sees the first ``seq_len - Q + 1 + i`` cached tokens.

Visible lengths are placed on page (16) and tile (16) boundaries -- 1, 15, 16, 17, 63, 64,
65 -- for every Q from 1 to 8, GQA and MLA, through the direct, split-reduce and merge
paths. 15-17 sit on the first page/tile edge and on the split edge of the split configs
at short lengths (16-token chunks), 63-65 on the fourth page edge and on the split edge
of longer requests (32-token chunks).
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels.decode_attention import (
    DecodeConfig,
    launch_decode_attention,
    reference_decode_attention,
)
from kernel_checks import check_decode

# fp32: IEEE dots, only summation order differs (~1e-6; 2e-4 for exp2, long sums);
# bf16: P and the output are rounded to an 8-bit mantissa (~1e-2)
TOL = {torch.float32: (2e-4, 2e-4), torch.bfloat16: (2e-2, 2e-2)}
VISIBLE = [1, 15, 16, 17, 63, 64, 65]


def lens_for(q_len: int) -> list[int]:
    """Request lengths whose token ``i % Q`` sees exactly ``VISIBLE[i]`` (its neighbours
    see one more or less), plus a request shorter than Q (its first tokens see nothing)."""
    lens = [v + q_len - 1 - (i % q_len) for i, v in enumerate(VISIBLE)]
    return lens + [max(0, q_len - 2)]


def make_case(dev, *, q_len, lens, hq=4, hk=2, dk=32, dv=None, page=16, pages=5,
              dtype=torch.float32, latent=False, seed=0):
    dv = dv or dk
    g = torch.Generator().manual_seed(seed)
    batch = len(lens)
    nb = batch * pages + 3
    q = torch.randn(batch, q_len, hq, dk, generator=g).to(dev, dtype)
    k = torch.randn(nb, page, hk, dk, generator=g).to(dev, dtype)
    v = k[..., :dv] if latent else torch.randn(nb, page, hk, dv, generator=g).to(dev, dtype)
    bt = torch.randperm(nb, generator=g)[:batch * pages].view(batch, pages).to(torch.int32)
    sl = torch.tensor(lens, dtype=torch.int32)
    return q, k, v, bt.to(dev), sl.to(dev)


def check(out, args, *, scale, **kw):
    return check_decode(out, args, TOL, scale=scale, **kw)


def cfg(splits=1, block_n=16, block_h=16, **kw):
    return DecodeConfig(num_kv_splits=splits, block_n=block_n, block_h=block_h, **kw)


SHAPES = {"gqa": dict(hq=4, hk=2, dk=32), "mla": dict(hq=4, hk=1, dk=48, dv=32, latent=True)}


#: query lengths that also run unsplit and merged (Q 3, 4, 6, 7 run split only: the same
#: code paths, at the suite's time budget)
FULL_Q = (1, 2, 5, 8)


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("q_len", range(1, 9))
def test_causal_masks_at_page_boundaries(dev, kind, q_len):
    lens = lens_for(q_len)
    args = make_case(dev, q_len=q_len, lens=lens, seed=q_len, **SHAPES[kind])
    rows = q_len * args[0].shape[2] // args[1].shape[2]
    block_h = max(16, 1 << (rows - 1).bit_length())
    configs = [cfg(3, block_h=block_h)]  # every Q split (the masks across split edges)
    if q_len in FULL_Q:  # and unsplit, and merged in 16-row blocks (tokens share a block)
        configs += [cfg(1, block_h=block_h), cfg(4, block_h=16, merge=True)]
    for c in configs:
        out = launch_decode_attention(c, *args, scale=0.2)
        ref = check(out, args, scale=0.2)
        # the short request (length max(0, Q - 2)): its tokens 0 and 1 see nothing and get
        # zeros; token 2 sees one cached token
        assert out[-1, :2].abs().max().item() == 0.0
        if q_len > 2:
            assert out[-1, 2].abs().max().item() > 0.0
        assert ref.abs().sum().item() > 0


def test_each_token_equals_a_single_token_call(dev):
    """Token ``i`` of a Q-token call is the one-token call at its visible length."""
    q_len, lens = 4, [5, 20, 33, 66]
    args = make_case(dev, q_len=q_len, lens=lens, seed=3)
    q, k, v, bt, sl = args
    many = launch_decode_attention(cfg(3), *args, scale=0.2)
    for i in range(q_len):
        visible = torch.clamp(sl - (q_len - 1 - i), min=0)
        one = launch_decode_attention(cfg(3), q[:, i].contiguous(), k, v, bt, visible,
                                      scale=0.2)
        torch.testing.assert_close(many[:, i], one, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("q_len,hq,block_h", [(2, 12, 16), (2, 16, 32), (3, 12, 64)])
def test_mla_latent_halves_rows_are_tokens_by_heads(dev, q_len, hq, block_h):
    # Dv 512 shared latent (_decode_stage1_latent): 12 heads x 2 tokens in 16-row blocks
    # (a block holds one token's 12 heads and 4 of the next's), 32 rows in one block (MTP:
    # the latent tile read once for both tokens), 36 rows in one 64-row block
    lens = [1 + q_len - 1, 17 + q_len - 1, 40]
    args = make_case(dev, q_len=q_len, lens=lens, hq=hq, hk=1, dk=576, dv=512, pages=3,
                     dtype=torch.bfloat16, latent=True, seed=hq)
    scale = 576 ** -0.5
    for c in (cfg(1, block_h=block_h), cfg(3, block_h=block_h),
              cfg(2, block_h=block_h, merge=True)):
        out = launch_decode_attention(c, *args, scale=scale)
        check(out, args, scale=scale)


@pytest.mark.parametrize("window,cap", [(7, 0.0), (20, 2.0), (None, 1.5)])
def test_sliding_window_and_logit_cap_per_token(dev, window, cap):
    q_len = 3
    args = make_case(dev, q_len=q_len, lens=[3, 18, 40, 80], seed=5, hk=1)
    q = args[0] * 3  # large scores, so the cap bites
    args = (q, *args[1:])
    kw = dict(sliding_window=window, logit_cap=cap)
    for c in (cfg(1), cfg(3), cfg(3, merge=True)):
        out = launch_decode_attention(c, *args, scale=0.2, **kw)
        check(out, args, scale=0.2, **kw)
    plain = reference_decode_attention(*args, scale=0.2)
    assert not torch.allclose(out.float(), plain, atol=1e-3)  # the options change it


def test_strided_q_and_out(dev):
    g = torch.Generator().manual_seed(7)
    b, q_len, hq, d = 2, 3, 4, 32
    args = make_case(dev, q_len=q_len, lens=[20, 45], seed=7)
    big = torch.randn(b, q_len + 1, hq + 2, d, generator=g).to(dev)
    q = big[:, 1:, 2:]  # token and head strides that are not the contiguous ones
    assert not q.is_contiguous()
    out = torch.empty(b, q_len, hq, 2 * d, device=dev)[..., :d]
    res = launch_decode_attention(cfg(2), q, *args[1:], scale=0.2, out=out)
    assert res.data_ptr() == out.data_ptr()
    check(out, (q, *args[1:]), scale=0.2)


def test_public_call_key_and_batch_invariance(dev):
    q_len = 2
    args = make_case(dev, q_len=q_len, lens=[300, 7, 512], hq=4, hk=1, pages=64, seed=12)
    q, k, v, bt, sl = args
    kw = dict(scale=0.125, batch_invariant=True)
    batched = kdispatch.decode_attention(*args, **kw)
    alone = kdispatch.decode_attention(q[1:2], k, v, bt[1:2], sl[1:2], **kw)
    assert torch.equal(batched[1:2], alone)
    check(batched, args, scale=0.125)
    ex = kdispatch.explain("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                           seq_lens=sl, batch_invariant=True)
    assert ex.key.q_len == q_len and ex.config.num_kv_splits > 1
    three = kdispatch.explain("decode_attention", q=q[:, 0], k_cache=k, v_cache=v,
                              block_table=bt, seq_lens=sl)
    assert three.key.q_len == 1


def test_torch_ops_with_four_dim_q(dev):
    args = make_case(dev, q_len=2, lens=[9, 30], seed=13)
    out = torch.ops.kdispatch.decode_attention(*args, 0.2)
    check(out, args, scale=0.2)
    buf = torch.empty_like(out)
    torch.ops.kdispatch.decode_attention_out(*args, 0.2, out=buf)
    assert torch.equal(buf, out)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args]
        shape = torch.ops.kdispatch.decode_attention(*fake, 0.2).shape
    assert tuple(shape) == tuple(out.shape) == (2, 2, 4, 32)


def test_bad_query_length_and_out_name_the_argument(dev):
    args = make_case(dev, q_len=2, lens=[9, 30], seed=1)
    q = args[0]
    b, _, hq, d = q.shape
    for bad_q in (q[:, :0], torch.randn(b, 9, hq, d, device=dev), q[None]):
        for call in (lambda a: launch_decode_attention(cfg(), *a, scale=0.1),
                     lambda a: kdispatch.decode_attention(*a, scale=0.1)):
            with pytest.raises(ValueError, match=r"^q:"):
                call((bad_q, *args[1:]))
    for bad_out in (torch.empty(b, hq, d, device=dev), torch.empty(b, 3, hq, d, device=dev)):
        with pytest.raises(ValueError, match=r"^out:"):
            launch_decode_attention(cfg(), *args, scale=0.1, out=bad_out)
    with pytest.raises(ValueError, match=r"^q_len:"):
        kdispatch.resolve("decode_attention", device="nvidia-h200", batch=1, context=64,
                          num_q_heads=4, num_kv_heads=1, head_dim=64, q_len=9)
