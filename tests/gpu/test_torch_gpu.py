"""The torch face on the GPU: Inductor fullgraph, reduce-overhead CUDA graphs, opcheck, and
the direct-launch host path against the JIT path (same bits, no host sync)."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels.decode_attention import reference_decode_attention

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::UserWarning")]


class Layer(torch.nn.Module):
    def __init__(self, hidden=512, hq=8, hk=2, d=128):
        super().__init__()
        self.hq, self.hk, self.d = hq, hk, d
        self.qkv = torch.nn.Linear(hidden, (hq + 2 * hk) * d, bias=False)
        self.o = torch.nn.Linear(hq * d, hidden, bias=False)

    def forward(self, x, kc, vc, slots, bt, sl):
        b = x.shape[0]
        q, k, v = self.qkv(x).split([self.hq * self.d, self.hk * self.d, self.hk * self.d], -1)
        kdispatch.write_kv(k.view(b, self.hk, self.d), v.view(b, self.hk, self.d), kc, vc, slots)
        att = kdispatch.decode_attention(q.reshape(b, self.hq, self.d), kc, vc, bt, sl,
                                         scale=self.d ** -0.5)
        return self.o(att.reshape(b, self.hq * self.d))


def _step(seed, b=4, pages=64, page=16, nb=512):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    bt = torch.randperm(nb, device="cuda", generator=g)[:b * pages].view(b, pages).int()
    lens = torch.randint(1, pages * page, (b,), device="cuda", generator=g)
    last = lens - 1
    slots = bt.long()[torch.arange(b, device="cuda"), last // page] * page + last % page
    return x, slots, bt, lens.int()


def _caches(nb=512, page=16):
    g = torch.Generator(device="cuda").manual_seed(99)
    kc = torch.randn(nb, page, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    return kc, torch.randn_like(kc)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_inductor_fullgraph_matches_eager_without_recompiles(mode):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    layer = Layer().cuda().to(torch.bfloat16)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer, backend=counter, fullgraph=True, mode=mode) \
        if mode == "default" else torch.compile(layer, fullgraph=True, mode=mode)
    kc, vc = _caches()
    ke, ve = kc.clone(), vc.clone()
    for seed in range(6):  # new lengths, slots and block tables every step (graph replays)
        x, slots, bt, sl = _step(seed)
        want = layer(x, ke, ve, slots, bt, sl)
        got = compiled(x, kc, vc, slots, bt, sl)
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
        assert torch.equal(kc, ke) and torch.equal(vc, ve)
    if mode == "default":
        assert counter.frame_count == 1, "recompiled when only values changed"


def test_opcheck_on_the_gpu():
    q = torch.randn(2, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = _caches(nb=16)
    bt = torch.arange(16, device="cuda", dtype=torch.int32).view(2, 8)
    sl = torch.tensor([5, 100], device="cuda", dtype=torch.int32)
    torch.library.opcheck(torch.ops.kdispatch.decode_attention.default,
                          (q, kc, vc, bt, sl, 0.1))
    key = torch.randn(3, 2, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([0, -1, 17], device="cuda")
    torch.library.opcheck(torch.ops.kdispatch.write_kv.default,
                          (key, key.clone(), kc.clone(), vc.clone(), slots))
    torch.library.opcheck(torch.ops.kdispatch.decode_attention.full,
                          (q, kc, vc, bt, sl, 0.1, 64, 0.0, True))
    torch.library.opcheck(torch.ops.kdispatch.write_kv.full,
                          (key, key.clone(), kc.clone(), vc.clone(), slots,
                           torch.tensor([True, False, True], device="cuda")))


@pytest.mark.parametrize("latent", [False, True], ids=["gqa", "mla"])
def test_direct_launches_give_the_jit_bits_without_syncing(latent):
    """The first call of a signature goes through Triton's JIT; later calls launch the
    compiled kernels directly. Same bits, and no host sync on the direct path."""
    torch.manual_seed(1)
    b, page, pages = 8, 16, 256
    nb = b * pages
    if latent:
        kc = torch.randn(nb, page, 1, 576, device="cuda", dtype=torch.bfloat16)
        k, v, q = kc, kc[..., :512], torch.randn(b, 16, 576, device="cuda", dtype=torch.bfloat16)
    else:
        k = torch.randn(nb, page, 8, 128, device="cuda", dtype=torch.bfloat16)
        v, q = torch.randn_like(k), torch.randn(b, 32, 128, device="cuda", dtype=torch.bfloat16)
    bt = torch.randperm(nb, device="cuda").view(b, pages).int()
    sl = torch.randint(1, pages * page, (b,), device="cuda").int()
    first = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.07)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = [kdispatch.decode_attention(q, k, v, bt, sl, scale=0.07) for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for a in again:
        assert torch.equal(a, first)
    torch.testing.assert_close(first.float(), reference_decode_attention(
        q, k, v, bt, sl, scale=0.07), atol=2e-2, rtol=2e-2)
    from kdispatch.kernels.decode_attention import launch

    entries = [e for e in launch._CACHE.values() if e.plan.out_shape == tuple(first.shape)]
    assert entries and entries[-1].stage1 is not None, "the direct path was not taken"
