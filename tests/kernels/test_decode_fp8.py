"""decode_attention over fp8 caches (interpreter on CPU, or the GPU).

Against the fp32 reference on the dequantized cache the kernel is held to q's dtype's
tolerance: fp8 -> bf16/fp16/fp32 is exact and the scales are applied in fp32, so nothing
beyond the bf16 path's roundings is added. Against the unquantized cache the error is the
cache's own quantization error; :data:`FP8_VS_BF16_REL` and :data:`FP8_VS_BF16_MAX` are the
bounds measured here (and documented in ``kdispatch.decode_attention``).
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.decode_attention import (
    DecodeConfig,
    launch_decode_attention,
    reference_decode_attention,
)
from kernel_checks import check_decode

FP8 = torch.float8_e4m3fn
# the dot inputs are q's dtype: bf16 rounds P (2^-8) and the output once more (~1e-2);
# fp16 2^-11 (~1e-3); fp32 IEEE dots (~1e-6, 2e-4 for exp2 and long reductions)
TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (5e-3, 5e-3), torch.bfloat16: (2e-2, 2e-2)}
RAGGED = [1, 15, 16, 17, 63, 64, 65, 0]
#: fp8 (per-tensor scale amax / 448) vs the same attention on the unquantized bf16 cache,
#: unit-variance random q/K/V, interpreter: relative error of the whole output (Frobenius)
#: 2.9-4.6% measured (GQA D 128 at lengths 1-256, q x1 and x3; MLA 576/512 at 15-48),
#: element-wise at most 5.7% of max|V| (one-token requests: the output is a V row, off by
#: its rounding, <= 2^-4 relative). The bounds below leave ~30% headroom.
FP8_VS_BF16_REL = 0.06
FP8_VS_BF16_MAX = 0.075


def make_case(dev, *, batch=3, hq=8, hk=2, dk=64, dv=None, page=16, pages=5, lens=None,
              dtype=torch.bfloat16, latent=False, seed=0, scaled=True):
    """Random q, an fp8 cache quantized from unit-variance values with per-tensor scales
    (amax / 448, as a calibrated engine sets them), a permuted page table; the
    unquantized bf16 cache too. MLA latent if ``latent``."""
    dv = dv or dk
    g = torch.Generator().manual_seed(seed)
    nb = batch * pages + 3
    q = torch.randn(batch, hq, dk, generator=g).to(dev, dtype)
    kf = torch.randn(nb, page, hk, dk, generator=g).bfloat16()
    vf = kf[..., :dv] if latent else torch.randn(nb, page, hk, dv, generator=g).bfloat16()
    ks = (kf.float().abs().amax() / 448).reshape(1) if scaled else None
    vs = ks if latent or not scaled else (vf.float().abs().amax() / 448).reshape(1)
    k = quantize_fp8(kf, ks, FP8).to(dev)
    v = k[..., :dv] if latent else quantize_fp8(vf, vs, FP8).to(dev)
    bt = torch.randperm(nb, generator=g)[:batch * pages].view(batch, pages).to(torch.int32)
    if lens is None:
        lens = torch.randint(1, pages * page + 1, (batch,), generator=g).tolist()
    sl = torch.tensor(lens, dtype=torch.int32)
    scales = {} if not scaled else {"k_scale": ks.to(dev), "v_scale": vs.to(dev)}
    return (q, k, v, bt.to(dev), sl.to(dev)), scales, (kf.to(dev), vf.to(dev))


def check(out, args, scales, **kw):
    return check_decode(out, args, TOL, **scales, **kw)


def cfg(splits=1, block_n=16, block_h=16, **kw):
    return DecodeConfig(num_kv_splits=splits, block_n=block_n, block_h=block_h, **kw)


CASES = {
    "gqa": dict(hq=8, hk=2, dk=64),
    "mha": dict(hq=4, hk=4, dk=32),
    "mla-narrow": dict(hq=4, hk=1, dk=96, dv=64, latent=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_matches_reference_on_ragged_lengths(dev, case):
    args, scales, _ = make_case(dev, batch=len(RAGGED), lens=RAGGED, seed=1, **CASES[case])
    scale = args[0].shape[-1] ** -0.5
    for c in (cfg(1), cfg(3), cfg(3, merge=True)):
        out = launch_decode_attention(c, *args, scale=scale, **scales)
        check(out, args, scales, scale=scale)
        assert out[-1].abs().max().item() == 0.0  # length 0: zeros


@pytest.mark.parametrize("window,cap", [(None, 0.0), (20, 0.0), (None, 3.0)])
def test_fp8_mla_latent_halves(dev, window, cap):
    # Dv 512 shared latent: _decode_stage1_latent, 20 heads (two head blocks), fp8 latent
    args, scales, _ = make_case(dev, batch=3, hq=20, hk=1, dk=576, dv=512, pages=3,
                                lens=[37, 0, 48], latent=True, seed=2)
    scale = 576 ** -0.5
    kw = dict(sliding_window=window, logit_cap=cap)
    for splits in (1, 3):
        out = launch_decode_attention(cfg(splits), *args, scale=scale, **scales, **kw)
        check(out, args, scales, scale=scale, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_fp8_cache_with_other_query_dtypes(dev, dtype):
    args, scales, _ = make_case(dev, dtype=dtype, lens=[1, 33, 80], seed=3)
    for splits in (1, 2):
        out = launch_decode_attention(cfg(splits), *args, scale=0.125, **scales)
        check(out, args, scales, scale=0.125)


def test_fp8_without_scales_dequantizes_at_one(dev):
    args, scales, _ = make_case(dev, lens=[5, 40, 80], seed=4, scaled=False)
    assert scales == {}
    out = launch_decode_attention(cfg(2), *args, scale=0.125)
    check(out, args, scales, scale=0.125)


def test_fp8_error_against_the_unquantized_cache(dev):
    """The documented bound: fp8 vs the same attention on the bf16 values it came from."""
    for kind, kw in (("gqa", dict(hq=8, hk=2, dk=128)),
                     ("mla", dict(hq=4, hk=1, dk=576, dv=512, latent=True, pages=3))):
        for seed in (0, 1):
            lens = [1, 16, 17, 80] if kind == "gqa" else [1, 15, 48]
            args, scales, (kf, vf) = make_case(dev, batch=len(lens), lens=lens, seed=seed,
                                               **kw)
            scale = args[0].shape[-1] ** -0.5
            out = launch_decode_attention(cfg(2), *args, scale=scale, **scales).float()
            exact = reference_decode_attention(args[0], kf, vf, *args[3:], scale=scale)
            rel = ((out - exact).norm() / exact.norm()).item()
            worst = (out - exact).abs().max().item() / vf.float().abs().max().item()
            assert rel <= FP8_VS_BF16_REL, (kind, seed, rel)
            assert worst <= FP8_VS_BF16_MAX, (kind, seed, worst)
            assert rel > 1e-3  # quantization did happen: the comparison can fail


def test_scales_are_read_by_the_kernel(dev):
    """One call signature, new scale values each call (what a replayed graph sees): each
    output matches the reference at the scales the kernel found."""
    args, scales, _ = make_case(dev, lens=[9, 47, 80], seed=5)
    ks, vs = scales["k_scale"], scales["v_scale"]
    base = (ks.clone(), vs.clone())
    outs = []
    for fk, fv in ((1.0, 1.0), (2.0, 1.0), (1.0, 0.5)):
        ks.copy_(base[0] * fk)
        vs.copy_(base[1] * fv)
        out = kdispatch.decode_attention(*args, scale=0.125, k_scale=ks, v_scale=vs)
        check(out, args, {"k_scale": ks, "v_scale": vs}, scale=0.125)
        outs.append(out)
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_fp8_strided_caches_and_views(dev):
    g = torch.Generator().manual_seed(9)
    b, hq, hk, d, page, pages = 2, 4, 2, 64, 16, 3
    nb = b * pages + 1
    ks = torch.tensor([0.01], device=dev)
    kv = quantize_fp8(torch.randn(nb, page, 2, hk, d + 16, generator=g), ks.cpu(), FP8)
    kv = kv.to(dev)  # K and V interleaved and padded: strided fp8 views
    k, v = kv[:, :, 0, :, :d], kv[:, :, 1, :, 8:8 + d]
    q = torch.randn(b, hq + 2 * hk, d, generator=g).bfloat16().to(dev)[:, :hq]
    bt = torch.randperm(nb, generator=g)[:b * pages].view(b, pages).int().to(dev)
    sl = torch.tensor([48, 21], dtype=torch.int32, device=dev)
    assert not k.is_contiguous() and not q.is_contiguous()
    scales = {"k_scale": ks, "v_scale": ks.clone()}
    out = launch_decode_attention(cfg(2), q, k, v, bt, sl, scale=0.125, **scales)
    check(out, (q, k, v, bt, sl), scales, scale=0.125)


def test_tuning_hooks_for_fp8_keys(dev):
    """make_inputs -> run == reference for fp8 keys (GQA and MLA, one and two tokens)."""
    from kdispatch.kernels.decode_attention import OP

    interp = kdispatch.Device.interpreter()
    for plain in (dict(num_q_heads=4, num_kv_heads=2, head_dim=64),
                  dict(num_q_heads=4, num_kv_heads=1, head_dim=96, head_dim_v=64, q_len=2)):
        key = OP.key(interp, dict(device=interp.key, batch=2, context=48,
                                  kv_dtype="float8_e4m3fn", **plain))
        inputs = OP.tuning.make_inputs(key, dev, seed=3)
        assert inputs["k_cache"].dtype == FP8 and inputs["k_scale"] is not None
        assert OP.key(interp, inputs) == key
        ref = OP.tuning.reference(inputs)
        atol, rtol = OP.tuning.tolerance(key)
        for c in list(OP.tuning.candidates(key))[:3]:
            torch.testing.assert_close(OP.tuning.run(c, inputs).float(), ref, atol=atol,
                                       rtol=rtol)
        assert OP.tuning.launches(OP.heuristic(key), inputs)


def _bad_cases(dev):
    args, scales, (kf, vf) = make_case(dev, batch=2, pages=2, seed=0)
    q, k, v, bt, sl = args
    good = dict(q=q, k_cache=k, v_cache=v, block_table=bt, seq_lens=sl, **scales)
    other = "meta" if torch.device(dev).type == "cpu" else "cpu"
    yield "k_scale", {**good, "k_scale": scales["k_scale"].to(other)}  # another device
    yield "v_scale", {**good, "v_scale": scales["v_scale"].to(other)}
    yield "k_scale", {**good, "k_cache": kf, "v_cache": vf}  # a non-fp8 cache with scales
    yield "k_scale", {**good, "k_scale": None}
    yield "v_scale", {**good, "v_scale": None}
    yield "k_scale", {**good, "k_scale": scales["k_scale"].half()}
    yield "v_scale", {**good, "v_scale": torch.ones(2, 1, device=dev)}
    yield "v_cache", {**good, "v_cache": vf}  # fp8 K with a bf16 V
    yield "k_cache", {**good, "k_cache": k.to(torch.float8_e5m2),
                      "v_cache": v.to(torch.float8_e5m2)}
    if torch.device(dev).type == "cpu":  # the interpreter has no fnuz type
        yield "k_cache", {**good, "k_cache": k.to(torch.float8_e4m3fnuz),
                          "v_cache": v.to(torch.float8_e4m3fnuz)}


def test_bad_fp8_input_names_the_argument(dev):
    cases = list(_bad_cases(dev))
    assert len(cases) >= 9
    for name, args in cases:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            launch_decode_attention(cfg(), **args, scale=0.1)
        with pytest.raises(ValueError, match=rf"^{name}:"):
            kdispatch.decode_attention(**args, scale=0.1)


def test_torch_ops_take_scales_and_query_tokens(dev):
    """opcheck of both ops with fp8 caches, scales and a 4-D q, and a torch.compile'd step
    (write, then decode two tokens) that matches eager."""
    args, scales, _ = make_case(dev, batch=2, pages=2, lens=[9, 20], seed=6)
    q, k, v, bt, sl = args
    q4 = torch.stack([q, q.flip(-1)], dim=1)  # [B, 2, Hq, Dk]
    # opcheck's schema test compares inputs with arithmetic torch lacks for fp8 tensors
    # ("mul_cpu_reduced_float" not implemented for Float8_e4m3fn): the other three run
    utils = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.kdispatch.decode_attention.full,
                          (q4, k, v, bt, sl, 0.2), dict(scales), test_utils=utils)
    rows = torch.randn(3, k.shape[2], k.shape[3], device=dev).bfloat16()
    slots = torch.tensor([0, 5, 17], device=dev)
    torch.library.opcheck(torch.ops.kdispatch.write_kv.full,
                          (rows, rows * 2, k.clone(), v.clone(), slots), dict(scales),
                          test_utils=utils)

    def step(q4, rows, k, v):
        kdispatch.write_kv(rows, rows * 2, k, v, slots, **scales)
        return kdispatch.decode_attention(q4, k, v, bt, sl, scale=0.2, **scales)

    k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
    eager = step(q4, rows, k1, v1)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q4, rows, k2, v2)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert torch.equal(eager, compiled) and eager.shape == (2, 2, 8, 64)
