"""Hostile page tables and slots never read or write outside the caches.

The caches are views into the middle of larger buffers whose guard regions hold NaN: a
kernel that read a page id outside ``[0, num_blocks)`` would put NaN into the output. Ids
far outside (10^6, 2^30) would fault. Runs on the interpreter and, on the device machine,
on the GPU (an illegal address there kills the CUDA context, failing every later test).
"""

from __future__ import annotations

import pytest
import torch

import kdispatch

GUARD = 3  # pages of NaN before and after the cache


def guarded_cache(dev, nb, page, h, d, dtype, g):
    buf = torch.full((nb + 2 * GUARD, page, h, d), float("nan"), dtype=dtype, device=dev)
    cache = buf[GUARD:GUARD + nb]
    cache.copy_(torch.randn(nb, page, h, d, generator=g).to(dtype))
    return buf, cache


def masked_reference(q, k, v, bt, sl, scale):
    """fp32 attention over the tokens whose page id is inside the cache."""
    b, hq, _ = q.shape
    nb, page, hk, _ = k.shape
    out = torch.zeros(b, hq, v.shape[3])
    for i in range(b):
        n = min(int(sl[i]), bt.shape[1] * page)
        pos = torch.arange(n)
        pages = bt[i].cpu().long()[pos // page]
        ok = (pages >= 0) & (pages < nb)
        if not bool(ok.any()):
            continue
        pages, slots = pages[ok], (pos % page)[ok]
        kk = k.cpu().float()[pages, slots]
        vv = v.cpu().float()[pages, slots]
        qi = q[i].cpu().float().view(hk, hq // hk, -1)
        p = torch.softmax(torch.einsum("hgd,lhd->hgl", qi, kk) * scale, -1)
        out[i] = torch.einsum("hgl,lhd->hgd", p, vv).reshape(hq, -1)
    return out


@pytest.mark.parametrize("bad", [-1, -2, "nb", "nb+1", 10 ** 6, 2 ** 30])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_masks_page_ids_outside_the_cache(dev, bad, splits):
    g = torch.Generator().manual_seed(7)
    b, hq, hk, d, page, pages = 3, 4, 2, 32, 16, 4
    nb = b * pages
    _, k = guarded_cache(dev, nb, page, hk, d, torch.float32, g)
    _, v = guarded_cache(dev, nb, page, hk, d, torch.float32, g)
    q = torch.randn(b, hq, d, generator=g).to(dev)
    bt = torch.randperm(nb, generator=g).view(b, pages).to(torch.int32)
    value = {"nb": nb, "nb+1": nb + 1}.get(bad, bad)
    bt[0, 1] = value          # a middle page of request 0
    bt[1, :] = value          # every page of request 1: nothing left to attend to
    bt[2, 3] = value          # the last (partial) page of request 2
    sl = torch.tensor([40, 33, 60], dtype=torch.int32)
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v,
                            block_table=bt.to(dev), seq_lens=sl.to(dev))
    cfg = cfg.model_copy(update={"num_kv_splits": splits, "block_n": 16})
    out = kdispatch.decode_attention(q, k, v, bt.to(dev), sl.to(dev), scale=0.2, config=cfg)
    assert bool(torch.isfinite(out).all())
    want = masked_reference(q, k, v, bt, sl, 0.2)
    torch.testing.assert_close(out.float().cpu(), want, atol=2e-4, rtol=2e-4)
    assert float(out[1].abs().max()) == 0.0


def test_mla_masks_page_ids_outside_the_latent_cache(dev):
    g = torch.Generator().manual_seed(8)
    b, hq, page, pages = 2, 4, 16, 2
    nb = b * pages
    _, kc = guarded_cache(dev, nb, page, 1, 576, torch.bfloat16, g)
    q = torch.randn(b, hq, 576, generator=g).to(dev, torch.bfloat16)
    bt = torch.arange(nb, dtype=torch.int32).view(b, pages)
    bt[0, 0], bt[1, 1] = -5, nb
    sl = torch.tensor([30, 29], dtype=torch.int32)
    out = kdispatch.decode_attention(q, kc, kc[..., :512], bt.to(dev), sl.to(dev),
                                     scale=576 ** -0.5)
    want = masked_reference(q, kc, kc[..., :512], bt, sl, 576 ** -0.5)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out.float().cpu(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("hq", [4, 64], ids=["masked-loads", "zero-row-64"])
def test_mla_splits_with_and_without_bad_pages_in_one_launch(dev, splits, hq):
    """Clean requests and splits beside ones that hold an out-of-cache id, in one grid; at
    a 64-row tile (64 heads) a bad page's rows read the zero row, narrower tiles mask the
    loads."""
    g = torch.Generator().manual_seed(11)
    b, page, pages = 3, 16, 4
    nb = b * pages
    _, kc = guarded_cache(dev, nb, page, 1, 576, torch.bfloat16, g)
    q = torch.randn(b, hq, 576, generator=g).to(dev, torch.bfloat16)
    bt = torch.randperm(nb, generator=g).view(b, pages).to(torch.int32)
    bt[0, 1] = -1             # request 0: its second page
    bt[2, 3] = 2 ** 30        # request 2: its last (partial) page; request 1 is clean
    sl = torch.tensor([64, 63, 49], dtype=torch.int32)
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=kc, v_cache=kc[..., :512],
                            block_table=bt.to(dev), seq_lens=sl.to(dev))
    cfg = cfg.model_copy(update={"num_kv_splits": splits, "block_n": 16, "pdl": False,
                                 "merge": False,
                                 **({"block_h": 64} if hq == 64 else {})})
    out = kdispatch.decode_attention(q, kc, kc[..., :512], bt.to(dev), sl.to(dev),
                                     scale=576 ** -0.5, config=cfg)
    want = masked_reference(q, kc, kc[..., :512], bt, sl, 576 ** -0.5)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out.float().cpu(), want, atol=2e-2, rtol=2e-2)


def test_writer_never_writes_outside_the_caches(dev):
    g = torch.Generator().manual_seed(9)
    t, h, d, page, nb = 6, 2, 32, 16, 4
    kbuf, kc = guarded_cache(dev, nb, page, h, d, torch.float32, g)
    vbuf, vc = guarded_cache(dev, nb, page, h, d, torch.float32, g)
    key = torch.randn(t, h, d, generator=g).to(dev)
    value = torch.randn(t, h, d, generator=g).to(dev)
    slots = torch.tensor([0, -1, nb * page, nb * page + 1, 2 ** 40, -(2 ** 40)],
                         dtype=torch.int64, device=dev)
    before_k, before_v = kc.clone(), vc.clone()
    kdispatch.write_kv(key, value, kc, vc, slots)
    assert torch.equal(kc[0, 0], key[0]) and torch.equal(vc[0, 0], value[0])
    assert torch.equal(kc.flatten(0, 1)[1:], before_k.flatten(0, 1)[1:])
    assert torch.equal(vc.flatten(0, 1)[1:], before_v.flatten(0, 1)[1:])
    for buf in (kbuf, vbuf):  # the guard regions still hold only NaN
        assert bool(buf[:GUARD].isnan().all()) and bool(buf[GUARD + nb:].isnan().all())
