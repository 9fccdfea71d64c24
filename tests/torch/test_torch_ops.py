"""The torch face: torch.library ops, their fake implementations, torch.compile, and the
cached host path (a stale cache entry never launches with other strides, dtypes or shapes).

CPU: the Triton interpreter and the aot_eager backend; GPU (marked): Inductor and
reduce-overhead CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels.decode_attention import reference_decode_attention
from kdispatch.kernels.kv_write import reference_kv_write

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def decode_case(dev, *, b=3, hq=4, hk=2, dk=32, dv=None, page=16, pages=3, dtype=torch.float32,
                latent=False, seed=0, lens=(1, 17, 33)):
    g = torch.Generator().manual_seed(seed)
    dv = dv or dk
    nb = b * pages + 2
    q = torch.randn(b, hq, dk, generator=g).to(dev, dtype)
    k = torch.randn(nb, page, hk, dk, generator=g).to(dev, dtype)
    v = k[..., :dv] if latent else torch.randn(nb, page, hk, dv, generator=g).to(dev, dtype)
    bt = torch.randperm(nb, generator=g)[:b * pages].view(b, pages).to(torch.int32).to(dev)
    sl = torch.tensor(lens[:b], dtype=torch.int32, device=dev)
    return q, k, v, bt, sl


def write_case(dev, *, t=5, h=2, d=32, page=16, blocks=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, 3 * h * d, generator=g).to(dev, dtype)
    key = qkv[:, h * d:2 * h * d].view(t, h, d)
    value = qkv[:, 2 * h * d:].view(t, h, d)
    kc = torch.randn(blocks, page, h, d, generator=g).to(dev, dtype)
    vc = torch.randn(blocks, page, h, d, generator=g).to(dev, dtype)
    slots = torch.randperm(blocks * page, generator=g)[:t].to(torch.int64).to(dev)
    slots[1] = -1  # skipped
    return key, value, kc, vc, slots


# -- registration and opcheck ------------------------------------------------------------------
def test_ops_are_registered_in_the_kdispatch_namespace():
    assert set(kdispatch.load_torch_ops()) >= {"decode_attention", "kv_write"}
    for name in ("decode_attention", "decode_attention_out", "write_kv"):
        assert hasattr(torch.ops.kdispatch, name), name
    schema = str(torch.ops.kdispatch.write_kv.default._schema)
    assert "Tensor(a!) key_cache" in schema and "Tensor(b!) value_cache" in schema


@pytest.mark.parametrize("latent", [False, True], ids=["gqa", "mla"])
def test_opcheck_decode_attention(dev, latent):
    kw = dict(hq=4, hk=1, dk=576, dv=512, dtype=torch.bfloat16, lens=(9, 16)) if latent \
        else {}
    q, k, v, bt, sl = decode_case(dev, b=2, latent=latent, **kw)
    torch.library.opcheck(torch.ops.kdispatch.decode_attention.default,
                          (q, k, v, bt, sl, 0.2))
    torch.library.opcheck(torch.ops.kdispatch.decode_attention.full,
                          (q, k, v, bt, sl, 0.2), {"sliding_window": 20, "logit_cap": 5.0})


def test_opcheck_decode_attention_out(dev):
    q, k, v, bt, sl = decode_case(dev, b=2)
    out = torch.empty(2, 4, 32, device=dev)
    torch.library.opcheck(torch.ops.kdispatch.decode_attention_out.default,
                          (q, k, v, bt, sl, 0.2), {"out": out})
    torch.library.opcheck(torch.ops.kdispatch.decode_attention_out.full,
                          (q, k, v, bt, sl, 0.2, 20), {"out": out})


def test_opcheck_write_kv(dev):
    key, value, kc, vc, slots = write_case(dev)
    torch.library.opcheck(torch.ops.kdispatch.write_kv.default, (key, value, kc, vc, slots))
    mask = torch.tensor([True, False] * (key.shape[0] // 2) + [True] * (key.shape[0] % 2),
                        device=dev)
    torch.library.opcheck(torch.ops.kdispatch.write_kv.full, (key, value, kc, vc, slots),
                          {"row_mask": mask})


def test_the_default_overloads_take_only_the_serving_call():
    """Each schema argument costs every call: the defaults carry none of the options,
    ``.full`` carries them all, and the packet reaches ``.full`` for a call with options."""
    kdispatch.load_torch_ops()
    ops = torch.ops.kdispatch
    lean = {"decode_attention": 6, "decode_attention_out": 7, "write_kv": 5}
    for name, n in lean.items():
        packet = getattr(ops, name)
        assert len(packet.default._schema.arguments) == n, name
        full = [a.name for a in packet.full._schema.arguments]
        assert {"config", "k_scale", "v_scale"} <= set(full), name
    assert [a.name for a in ops.write_kv.full._schema.arguments][5:7] == ["row_mask",
                                                                          "active_rows"]


def test_the_packet_with_options_gives_the_public_bits(dev):
    q, k, v, bt, sl = decode_case(dev, b=2)
    a = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.3, sliding_window=20)
    b = torch.ops.kdispatch.decode_attention(q, k, v, bt, sl, 0.3, sliding_window=20)
    c = torch.ops.kdispatch.decode_attention.full(q, k, v, bt, sl, 0.3, 20)
    assert torch.equal(a, b) and torch.equal(a, c)
    key, value, kc, vc, slots = write_case(dev)
    mask = torch.ones(key.shape[0], dtype=torch.bool, device=dev)
    mask[0] = False
    kc2, vc2 = kc.clone(), vc.clone()
    kdispatch.write_kv(key, value, kc, vc, slots, row_mask=mask)
    torch.ops.kdispatch.write_kv(key, value, kc2, vc2, slots, row_mask=mask)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@pytest.mark.parametrize("name", ["decode_attention", "decode_attention_out", "write_kv",
                                  "decode_attention.full", "decode_attention_out.full",
                                  "write_kv.full"])
def test_autograd_falls_through_to_the_kernel(name):
    """No autograd fallback per call: the CPU and CUDA autograd keys fall through."""
    kdispatch.load_torch_ops()
    table = torch._C._dispatch_dump_table(f"kdispatch::{name}").splitlines()
    for key in ("AutogradCPU", "AutogradCUDA"):
        row = next(line for line in table if line.startswith(f"{key}:"))
        assert "fallthrough" in row and "torch_library.py" in row, row


def test_outputs_never_require_grad_like_the_public_functions(dev):
    q, k, v, bt, sl = decode_case(dev)
    q.requires_grad_(True)
    a = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.3)
    b = torch.ops.kdispatch.decode_attention(q, k, v, bt, sl, 0.3)
    assert not a.requires_grad and not b.requires_grad and b.grad_fn is None
    assert torch.equal(a, b)
    torch.library.opcheck(torch.ops.kdispatch.decode_attention.default,
                          (q, k, v, bt, sl, 0.3),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


def test_torch_ops_and_public_functions_give_the_same_bits(dev):
    q, k, v, bt, sl = decode_case(dev, dtype=torch.float16)
    a = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.3)
    b = torch.ops.kdispatch.decode_attention(q, k, v, bt, sl, 0.3)
    assert torch.equal(a, b)
    out = torch.empty_like(a)
    torch.ops.kdispatch.decode_attention_out(q, k, v, bt, sl, 0.3, out=out)
    assert torch.equal(a, out)
    key, value, kc, vc, slots = write_case(dev)
    kc2, vc2 = kc.clone(), vc.clone()
    kdispatch.write_kv(key, value, kc, vc, slots)
    torch.ops.kdispatch.write_kv(key, value, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_a_config_reaches_the_torch_op_as_json(dev):
    q, k, v, bt, sl = decode_case(dev)
    cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v, block_table=bt,
                            seq_lens=sl).model_copy(update={"num_kv_splits": 2})
    a = kdispatch.decode_attention(q, k, v, bt, sl, scale=0.3, config=cfg)
    b = torch.ops.kdispatch.decode_attention.full(q, k, v, bt, sl, 0.3,
                                                  config=cfg.model_dump_json())
    assert torch.equal(a, b)


# -- torch.compile -------------------------------------------------------------------------------
class DecodeLayer(torch.nn.Module):
    """projection -> write_kv -> decode_attention -> projection (one decode step)."""

    def __init__(self, hidden=64, hq=4, hk=2, d=32):
        super().__init__()
        self.hq, self.hk, self.d = hq, hk, d
        g = torch.Generator().manual_seed(3)
        self.qkv = torch.nn.Linear(hidden, (hq + 2 * hk) * d, bias=False)
        self.o = torch.nn.Linear(hq * d, hidden, bias=False)
        with torch.no_grad():
            for lin in (self.qkv, self.o):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.1)

    def forward(self, x, k_cache, v_cache, slots, block_table, seq_lens):
        b = x.shape[0]
        q, k, v = self.qkv(x).split([self.hq * self.d, self.hk * self.d, self.hk * self.d], -1)
        kdispatch.write_kv(k.view(b, self.hk, self.d), v.view(b, self.hk, self.d), k_cache,
                           v_cache, slots)
        att = kdispatch.decode_attention(q.reshape(b, self.hq, self.d), k_cache, v_cache,
                                         block_table, seq_lens, scale=self.d ** -0.5)
        return self.o(att.reshape(b, self.hq * self.d))


def layer_inputs(dev, seed, b=2, pages=2, page=16):
    g = torch.Generator().manual_seed(seed)
    nb = 4 * pages  # the cache's size does not follow the batch
    x = torch.randn(b, 64, generator=g).to(dev)
    kc = torch.randn(nb, page, 2, 32, generator=g).to(dev)
    vc = torch.randn(nb, page, 2, 32, generator=g).to(dev)
    bt = torch.randperm(nb, generator=g)[:b * pages].view(b, pages).to(torch.int32).to(dev)
    lens = torch.randint(1, pages * page + 1, (b,), generator=g)
    last = lens - 1  # this step's token goes to the request's last position
    slots = bt.cpu().long()[torch.arange(b), last // page] * page + last % page
    return x, kc, vc, slots.to(dev), bt, lens.to(torch.int32).to(dev)


def test_a_decode_layer_compiles_fullgraph_matches_eager_and_never_recompiles(dev):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    layer = DecodeLayer().to(dev)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    for seed in range(4):  # new lengths, slots and block tables each step
        x, kc, vc, slots, bt, sl = layer_inputs(dev, seed)
        kc2, vc2 = kc.clone(), vc.clone()
        want = layer(x, kc, vc, slots, bt, sl)
        got = compiled(x, kc2, vc2, slots, bt, sl)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the write happened
    assert counter.frame_count == 1, "recompiled when only values changed"


@pytest.mark.parametrize("options", [False, True], ids=["serving-call", "with-options"])
def test_a_compiled_call_names_the_overload_its_arguments_need(dev, options):
    """The plain serving call traces to the lean default overloads; a window or a row mask
    to ``.full``; both match eager."""
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                    and "kdispatch" in str(n.target))
        return gm

    extra = dict(sliding_window=20) if options else {}

    def step(key, value, kc, vc, slots, q, bt, sl):
        mask = torch.ones_like(slots, dtype=torch.bool) if options else None
        kdispatch.write_kv(key, value, kc, vc, slots, row_mask=mask)
        return kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.3, **extra)

    key, value, kc, vc, slots = write_case(dev, t=2)
    q = torch.randn(2, 4, 32, device=dev)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev)
    sl = torch.tensor([17, 30], dtype=torch.int32, device=dev)
    kc2, vc2 = kc.clone(), vc.clone()
    want = step(key, value, kc, vc, slots, q, bt, sl)
    got = torch.compile(step, backend=backend, fullgraph=True)(key, value, kc2, vc2, slots,
                                                               q, bt, sl)
    assert torch.equal(got, want) and torch.equal(kc, kc2)
    suffix = "full" if options else "default"
    assert sorted(seen) == [f"kdispatch.decode_attention.{suffix}",
                            f"kdispatch.write_kv.{suffix}"], seen


def test_the_fake_implementations_propagate_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(5, 12, 576, dtype=torch.bfloat16)
        kc = torch.empty(40, 16, 1, 576, dtype=torch.bfloat16)
        bt = torch.empty(5, 8, dtype=torch.int32)
        sl = torch.empty(5, dtype=torch.int32)
        out = torch.ops.kdispatch.decode_attention(q, kc, kc[..., :512], bt, sl, 0.1)
        assert out.shape == (5, 12, 512) and out.dtype == torch.bfloat16


# -- the cached host path ----------------------------------------------------------------------
def test_cached_path_revalidates_when_strides_dtype_or_shape_change(dev):
    """The cache keys every tensor's shape, strides, dtype, device and alignment: a call
    that differs in any of them checks and plans again, and computes the right answer.
    Each signature runs three times (the first plans, the second makes the fast check on
    a GPU, the third takes it), so each change meets the previous signature's fast
    check."""
    q, k, v, bt, sl = decode_case(dev, b=2, lens=(20, 33))
    ref = reference_decode_attention(q, k, v, bt, sl, scale=0.25)
    for _ in range(3):  # the second call of a signature takes the cached path
        torch.testing.assert_close(kdispatch.decode_attention(q, k, v, bt, sl, scale=0.25),
                                   ref, atol=2e-4, rtol=2e-4)
    # the same values through a strided q (a view into a wider buffer)
    wide = torch.zeros(2, 4, 64, device=dev)
    wide[..., 16:48] = q
    qs = wide[..., 16:48]
    assert qs.stride() != q.stride()
    for _ in range(3):
        torch.testing.assert_close(kdispatch.decode_attention(qs, k, v, bt, sl, scale=0.25),
                                   ref, atol=2e-4, rtol=2e-4)
    # a cache with other strides: heads-major storage viewed in the [nb, page, h, d] layout
    kt = k.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    assert kt.stride() != k.stride() and torch.equal(kt, k)
    for _ in range(3):
        torch.testing.assert_close(kdispatch.decode_attention(q, kt, v, bt, sl, scale=0.25),
                                   ref, atol=2e-4, rtol=2e-4)
    # another dtype and another shape
    q16, k16, v16 = q.half(), k.half(), v.half()
    ref16 = reference_decode_attention(q16, k16, v16, bt, sl, scale=0.25)
    for _ in range(3):
        out = kdispatch.decode_attention(q16, k16, v16, bt, sl, scale=0.25)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), ref16, atol=5e-3, rtol=5e-3)
    # q at an odd offset (not 16-byte aligned): the same shape and strides
    buf = torch.empty(q.numel() + 1, device=dev)
    qm = buf[1:].view(q.shape)
    qm.copy_(q)
    assert qm.stride() == q.stride() and qm.data_ptr() % 16
    for _ in range(3):
        torch.testing.assert_close(kdispatch.decode_attention(qm, k, v, bt, sl, scale=0.25),
                                   ref, atol=2e-4, rtol=2e-4)
    # an out= buffer, then a latent cache whose V is K's leading columns (one pointer),
    # then a V of the same shape and strides elsewhere
    o = torch.empty_like(ref)
    for _ in range(3):
        kdispatch.decode_attention(q, k, v, bt, sl, scale=0.25, out=o)
        torch.testing.assert_close(o, ref, atol=2e-4, rtol=2e-4)
    ql, kl, vl, btl, sll = decode_case(dev, b=2, hq=4, hk=1, dk=48, dv=32, latent=True,
                                       lens=(20, 33))
    for v_other in (vl, kl.clone()[..., :32]):
        refl = reference_decode_attention(ql, kl, v_other, btl, sll, scale=0.25)
        for _ in range(3):
            torch.testing.assert_close(
                kdispatch.decode_attention(ql, kl, v_other, btl, sll, scale=0.25), refl,
                atol=2e-4, rtol=2e-4)
    q1, bt1, sl1 = q[:1], bt[:1], sl[:1]
    for _ in range(3):
        out = kdispatch.decode_attention(q1, k, v, bt1, sl1, scale=0.25)
        torch.testing.assert_close(out, ref[:1], atol=2e-4, rtol=2e-4)


def test_cached_path_still_rejects_bad_calls(dev):
    q, k, v, bt, sl = decode_case(dev, b=2, lens=(20, 33))
    kdispatch.decode_attention(q, k, v, bt, sl, scale=0.25)
    kdispatch.decode_attention(q, k, v, bt, sl, scale=0.25)
    for bad in (float("nan"), float("inf"), "0.1", torch.tensor(0.1)):
        with pytest.raises(ValueError, match="^scale"):
            kdispatch.decode_attention(q, k, v, bt, sl, scale=bad)
    with pytest.raises(ValueError, match="^logit_cap"):
        kdispatch.decode_attention(q, k, v, bt, sl, scale=0.25, logit_cap=float("inf"))
    with pytest.raises(ValueError, match="^out"):
        kdispatch.decode_attention(q, k, v, bt, sl, scale=0.25, out=torch.empty(2, 4, 31))


def test_cached_writer_revalidates_and_counts_its_resolutions(dev):
    key, value, kc, vc, slots = write_case(dev)
    before = kdispatch.stats().resolutions
    for _ in range(3):
        kc0, vc0 = kc.clone(), vc.clone()
        kdispatch.write_kv(key, value, kc, vc, slots)
        rk, rv = reference_kv_write(key, value, kc0, vc0, slots)
        assert torch.equal(kc.float(), rk) and torch.equal(vc.float(), rv)
    assert kdispatch.stats().resolutions - before == 3  # memo hits counted on the fast path
    # contiguous K/V instead of views into a qkv projection, then a cache of other strides
    # (heads-major storage): new signatures, right answers, each met first by the
    # previous signature's fast check (on a GPU)
    kcs = kc.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    for args in ((key.contiguous(), value.contiguous(), kc, vc),
                 (key.contiguous(), value.contiguous(), kcs, vc)):
        for _ in range(3):
            kc0, vc0 = args[2].clone(), vc.clone()
            kdispatch.write_kv(*args, slots)
            rk, rv = reference_kv_write(key, value, kc0, vc0, slots)
            assert torch.equal(args[2].float(), rk) and torch.equal(vc.float(), rv)
    with pytest.raises(ValueError, match="^slot_mapping"):
        kdispatch.write_kv(key, value, kc, vc, slots[:-1])


def test_a_dynamic_batch_compiles_once(dev):
    """With the batch marked dynamic, new batch sizes reuse the graph; the config is
    resolved inside the op from each call's concrete shapes."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    layer = DecodeLayer().to(dev)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    for seed, b in enumerate((2, 3, 4)):
        x, kc, vc, slots, bt, sl = layer_inputs(dev, seed, b=b)
        for t in (x, slots, bt, sl):
            torch._dynamo.mark_dynamic(t, 0)
        kc2, vc2 = kc.clone(), vc.clone()
        want = layer(x, kc, vc, slots, bt, sl)
        torch.testing.assert_close(compiled(x, kc2, vc2, slots, bt, sl), want,
                                   atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1
