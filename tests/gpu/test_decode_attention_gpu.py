"""decode_attention on the GPU: graph capture + replay, sync-free resolve, > 2^31 caches."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels.decode_attention import reference_decode_attention

pytestmark = pytest.mark.gpu

RAGGED = [[1, 63, 64, 65, 4096, 4097, 65536, 327600],
          [308736, 308737, 312831, 312832, 312833, 320000, 327599, 327600]]


def _close(out, ref, tol=2e-2):
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_kimi_mla_graph_capture_and_replay_ragged():
    torch.manual_seed(0)
    b, hq, dk, dv, page, ctx = 8, 12, 576, 512, 16, 327600
    pages = -(-ctx // page)
    nb = b * pages + 5
    k = torch.randn(nb, page, 1, dk, device="cuda", dtype=torch.bfloat16)
    v = k[..., :dv]
    q = torch.randn(b, hq, dk, device="cuda", dtype=torch.bfloat16)
    bt = torch.randperm(nb, device="cuda")[:b * pages].view(b, pages).int()
    sl = torch.full((b,), 100, dtype=torch.int32, device="cuda")
    scale = dk ** -0.5
    out = torch.empty(b, hq, dv, device="cuda", dtype=torch.bfloat16)
    call = lambda: kdispatch.decode_attention(q, k, v, bt, sl, scale=scale, out=out)  # noqa
    call()  # compile outside capture
    torch.cuda.synchronize()
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl)
    assert cfg.num_kv_splits > 1
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for i, lens in enumerate(RAGGED * 2):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        if i >= 2:  # new page tables too
            bt.copy_(torch.randperm(nb, device="cuda")[:b * pages].view(b, pages).int())
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        _close(out, reference_decode_attention(q, k, v, bt, sl, scale=scale))


def test_batch_invariant_bits_at_many_splits():
    # a request's bits alone and in a batch of 40, at > 32 splits (a reduce launch shape
    # that varied with the batch changed them: session 6)
    torch.manual_seed(3)
    b, hq, dk, dv, page, cap = 40, 16, 576, 512, 16, 65536
    nb = 2000  # pages may repeat across requests: reads only
    k = torch.randn(nb, page, 1, dk, device="cuda", dtype=torch.bfloat16)
    v = k[..., :dv]
    q = torch.randn(b, hq, dk, device="cuda", dtype=torch.bfloat16)
    bt = torch.randint(0, nb, (b, cap // page), device="cuda", dtype=torch.int32)
    sl = torch.randint(3000, 6001, (b,), device="cuda", dtype=torch.int32)
    kw = dict(scale=dk ** -0.5, batch_invariant=True)
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl, batch_invariant=True)
    assert cfg.num_kv_splits > 32 and not cfg.merge
    batched = kdispatch.decode_attention(q, k, v, bt, sl, **kw)
    for r in (0, 17, b - 1):
        alone = kdispatch.decode_attention(q[r:r + 1], k, v, bt[r:r + 1], sl[r:r + 1], **kw)
        assert torch.equal(batched[r:r + 1], alone)
    _close(batched, reference_decode_attention(q, k, v, bt, sl, scale=dk ** -0.5))


def test_resolve_and_launch_without_sync():
    q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(300, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    bt = torch.randperm(300, device="cuda")[:4 * 64].view(4, 64).int()
    sl = torch.tensor([1, 500, 1023, 1024], dtype=torch.int32, device="cuda")
    kdispatch.decode_attention(q, k, v, bt, sl, scale=0.088)  # compile
    kdispatch.reset_dispatcher()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.088)
        out2 = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.088, batch_invariant=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref = reference_decode_attention(q, k, v, bt, sl, scale=0.088)
    _close(out, ref)
    _close(out2, ref)


def test_cache_over_2_pow_31_elements():
    page, hk, d = 16, 1, 128
    nb = (1 << 31) // (page * hk * d) + 4096  # > 2^31 elements per cache
    k = torch.empty(nb, page, hk, d, device="cuda", dtype=torch.bfloat16).normal_()
    v = k  # one tensor as K and V (shared path, Dv == Dk)
    assert k.numel() > 2 ** 31
    q = torch.randn(2, 4, d, device="cuda", dtype=torch.bfloat16)
    pages = 40
    bt = torch.arange(nb - 2 * pages, nb, device="cuda", dtype=torch.int32).view(2, pages)
    sl = torch.tensor([pages * page, 333], dtype=torch.int32, device="cuda")
    for splits in (1, 4):
        out = kdispatch.decode_attention(q, k, v, bt, sl, scale=d ** -0.5,
                                         config={"num_kv_splits": splits})
        _close(out, reference_decode_attention(q, k, v, bt, sl, scale=d ** -0.5))
    vs = torch.empty(nb, page, hk, d, device="cuda", dtype=torch.bfloat16).normal_()
    out = kdispatch.decode_attention(q, k, vs, bt, sl, scale=d ** -0.5)
    _close(out, reference_decode_attention(q, k, vs, bt, sl, scale=d ** -0.5))


def test_pdl_reduce_chain_in_a_graph_sees_each_stage():
    """Eight decodes in one graph, each one's q the previous one's output (GQA, Dk == Dv),
    with the reduce launched early (pdl): a reduce reading partials before its stage 1 had
    finished, or a stage 1 reading a q the previous reduce had not written, would differ
    from the reference applied to the previous step's actual output."""
    from kdispatch.kernels.decode_attention import DecodeConfig, launch_decode_attention

    torch.manual_seed(1)
    b, hq, hk, d, page, pages = 4, 32, 8, 128, 16, 512
    nb = b * pages + 3
    k = torch.randn(nb, page, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    bt = torch.randperm(nb, device="cuda")[:b * pages].view(b, pages).int()
    sl = torch.tensor([1, 4097, 8191, 8192], dtype=torch.int32, device="cuda")
    qs = [torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)]
    qs += [torch.empty_like(qs[0]) for _ in range(8)]
    cfg = DecodeConfig(num_kv_splits=16, block_n=64, block_h=16, num_warps=4, num_stages=3,
                       pdl=True)

    def chain():
        for i in range(8):
            launch_decode_attention(cfg, qs[i], k, v, bt, sl, scale=d ** -0.5, out=qs[i + 1])

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for _ in range(3):
        qs[0].normal_()
        sl.copy_(torch.randint(1, pages * page + 1, (b,), device="cuda", dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        for i in range(8):
            _close(qs[i + 1], reference_decode_attention(qs[i], k, v, bt, sl, scale=d ** -0.5))


@pytest.mark.parametrize("latent", [False, True], ids=["gqa", "mla"])
def test_merge_chain_in_a_graph_sees_every_split(latent):
    """merge=True (the last stage-1 program merges; no reduce kernel), eight decodes chained
    in one graph (each q the previous output; MLA feeds back the first 512 of 576 columns'
    worth through a fresh q), replayed with new lengths: a merging program that read a
    partial before its writer had stored it, or a counter left non-zero by a previous
    replay, would differ from the reference; replays of the same inputs give the same bits."""
    from kdispatch.kernels.decode_attention import DecodeConfig, launch_decode_attention

    torch.manual_seed(2)
    if latent:
        b, hq, hk, dk, dv, page, pages = 32, 16, 1, 576, 512, 16, 256
        cfg = DecodeConfig(num_kv_splits=8, block_n=32, block_h=16, num_warps=4,
                           num_stages=3, merge=True)
    else:
        b, hq, hk, dk, dv, page, pages = 4, 32, 8, 128, 128, 16, 512
        cfg = DecodeConfig(num_kv_splits=16, block_n=64, block_h=16, num_warps=4,
                           num_stages=3, merge=True)
    nb = b * pages + 3
    k = torch.randn(nb, page, hk, dk, device="cuda", dtype=torch.bfloat16)
    v = k[..., :dv] if latent else torch.randn(nb, page, hk, dv, device="cuda",
                                               dtype=torch.bfloat16)
    bt = torch.randperm(nb, device="cuda")[:b * pages].view(b, pages).int()
    sl = torch.randint(1, pages * page + 1, (b,), device="cuda", dtype=torch.int32)
    qs = [torch.randn(b, hq, dk, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    outs = [torch.empty(b, hq, dv, device="cuda", dtype=torch.bfloat16) for _ in range(8)]

    def chain():
        for i in range(8):
            if i:  # the next q depends on the previous output (stream order across calls)
                qs[i][..., :dv].copy_(outs[i - 1])
            launch_decode_attention(cfg, qs[i], k, v, bt, sl, scale=dk ** -0.5, out=outs[i])

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    lens_sets = [[1, 15, 16, 17, 63, 64, 65, pages * page] * (b // 8 or 1),
                 torch.randint(1, pages * page + 1, (b,)).tolist()]
    for lens in lens_sets:
        sl.copy_(torch.tensor(lens[:b], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        first = [o.clone() for o in outs]
        for i in range(8):
            _close(outs[i], reference_decode_attention(qs[i], k, v, bt, sl, scale=dk ** -0.5))
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, o) for a, o in zip(first, outs))
