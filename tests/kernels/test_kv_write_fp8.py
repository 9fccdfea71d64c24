"""kv_write into fp8 caches: bit for bit what ``(x.float() / scale).clamp(-448, 448)
.to(float8_e4m3fn)`` stores (CPU: the interpreter's integer rounding; GPU: its fp8 cast).

Every comparison covers the entire K and V pools, pre-filled with random fp8 values, so a
stray write or a missed row shows up anywhere.
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.kv_write import OP as SPEC
from kdispatch.kernels.kv_write import (
    KVWriteConfig,
    KVWriteKey,
    launch_kv_write,
    reference_kv_write,
)
from kdispatch.opdef import OpKey
from kernel_checks import check_write, fp8_bytes, write_masks
from kernel_checks import rand_nonzero as _rand

FP8 = torch.float8_e4m3fn
HEADS, DIM, PAGE, BLOCKS = 3, 24, 4, 40  # odd heads, non-pow2 dim: both masked tails


def make_case(device, *, tokens, dtype=torch.bfloat16, seed=0, negative=0, spread=300.0,
              scales=True, scale_shape=(1,), v_layout="flash"):
    """K/V as views of one qkv projection (values up to ``1.25 x spread``), random fp8
    pools, unique random slots including the first and the last of the cache."""
    gen = torch.Generator().manual_seed(seed)
    hd = HEADS * DIM
    qkv = _rand(gen, tokens, 3 * hd, dtype=dtype, device=device, spread=spread)
    key = qkv[:, hd:2 * hd].view(tokens, HEADS, DIM)
    value = qkv[:, 2 * hd:].view(tokens, HEADS, DIM)
    key_cache = _rand(gen, BLOCKS, PAGE, HEADS, DIM, dtype=FP8, device=device)
    if v_layout == "flash":
        value_cache = _rand(gen, BLOCKS, PAGE, HEADS, DIM, dtype=FP8, device=device)
    else:  # stored [blocks, heads, page, dim], viewed as [blocks, page, heads, dim]
        value_cache = _rand(gen, BLOCKS, HEADS, PAGE, DIM, dtype=FP8,
                            device=device).permute(0, 2, 1, 3)
    slots = torch.randperm(BLOCKS * PAGE - 2, generator=gen)[:tokens] + 1
    slots[0] = 0
    if tokens > 1:
        slots[-1] = BLOCKS * PAGE - 1
    if negative:
        slots[torch.randperm(tokens, generator=gen)[:negative]] = -1
    case = {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
            "slot_mapping": slots.to(device)}
    if scales:
        # K at scale 0.5: values up to 375 / 0.5 = 750 saturate at 448; V at 2.0 stays in range
        case["k_scale"] = torch.full(scale_shape, 0.5, device=device)
        case["v_scale"] = torch.full(scale_shape, 2.0, device=device)
    return case


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("tokens", [1, 15, 16, 17, 63, 64, 65])
def test_fp8_write_is_bit_exact_with_saturation_and_negative_slots(dev, dtype, tokens):
    case = make_case(dev, tokens=tokens, dtype=dtype, seed=tokens, negative=tokens // 4)
    cfg = kdispatch.resolve("kv_write", **{k: v for k, v in case.items() if "scale" not in k})
    before = case["key_cache"].clone()
    check_write(cfg, case)
    written = case["slot_mapping"] >= 0
    blk, off = case["slot_mapping"][written] // PAGE, case["slot_mapping"][written] % PAGE
    stored_k = case["key_cache"][blk, off].float()
    # the values really were quantized (saturated where |x / 0.5| > 448), not copied
    assert stored_k.abs().max().item() == 448.0 or tokens == 1 and written.sum() == 0
    want = quantize_fp8(case["key"][written], case["k_scale"], FP8).float()
    assert torch.equal(stored_k, want)
    assert not torch.equal(case["key_cache"], before) or not written.any()


def test_every_fp8_value_and_rounding_tie(dev):
    """Every finite e4m3fn value, the midpoints between neighbours (ties to even) and their
    fp32 neighbours, +-inf, NaN, +-0 and out-of-range values, through the kernel."""
    allv = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    vals = allv[~allv.isnan()].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    up, down = torch.full_like(mids, 1e9), torch.full_like(mids, -1e9)
    extra = torch.tensor([1e9, -1e9, 464.0, 465.0, -480.0, 1e-12, -0.0, 0.0, float("inf"),
                          -float("inf"), float("nan"), 2.0 ** -10, 3 * 2.0 ** -11])
    x = torch.cat([vals, mids, torch.nextafter(mids, up), torch.nextafter(mids, down), extra])
    rows = -(-x.numel() // (HEADS * DIM))
    x = torch.cat([x, torch.ones(rows * HEADS * DIM - x.numel())]).view(rows, HEADS, DIM)
    blocks = -(-rows // PAGE) + 1
    cache = torch.zeros(blocks, PAGE, HEADS, DIM, dtype=FP8, device=dev)
    slots = torch.arange(rows, device=dev)
    one = torch.ones(1, device=dev)
    for scale in (None, one):
        kc, vc = cache.clone(), cache.clone()
        kw = {} if scale is None else {"k_scale": scale, "v_scale": scale}
        launch_kv_write(KVWriteConfig(block_h=4, num_warps=1), x.to(dev), -x.to(dev), kc, vc,
                        slots, **kw)
        got_k = fp8_bytes(kc.view(-1, HEADS, DIM)[:rows].cpu())
        got_v = fp8_bytes(vc.view(-1, HEADS, DIM)[:rows].cpu())
        assert torch.equal(got_k, fp8_bytes(x.clamp(-448, 448).to(FP8)))
        assert torch.equal(got_v, fp8_bytes((-x).clamp(-448, 448).to(FP8)))


@pytest.mark.parametrize("masking", ["row_mask", "active_rows", "both"])
def test_fp8_masked_forms_and_strided_cache(dev, masking):
    tokens = 17
    case = make_case(dev, tokens=tokens, seed=3, negative=2, v_layout="heads_major")
    row_mask, active_rows = write_masks(dev, tokens, masking)
    cfg = KVWriteConfig(block_h=2, block_t=2, num_warps=2)
    check_write(cfg, case, row_mask, active_rows)


def test_fp8_two_values_a_thread(dev):
    """The one-token fp8 tile (2 values a thread, 8 warps) and a 1-warp tile of 2 a thread."""
    check_write(KVWriteConfig(block_h=4, num_warps=8), make_case(dev, tokens=1, seed=21))
    check_write(KVWriteConfig(block_h=2, num_warps=1), make_case(dev, tokens=17, seed=22))


def test_fp8_without_scales_quantizes_at_scale_one(dev):
    case = make_case(dev, tokens=9, seed=4, scales=False, spread=100.0)
    check_write(KVWriteConfig(block_h=4, num_warps=1), case)
    ref_k, _ = reference_kv_write(**case)
    assert ref_k.abs().max().item() > 100  # unscaled: large values kept (then saturated)


@pytest.mark.parametrize("scale_shape", [(1,), ()], ids=["one", "scalar"])
def test_scales_are_read_by_the_kernel(dev, scale_shape):
    """The cached path (one signature) sees new scale values on every call: a captured
    graph replays with the scales it finds."""
    case = make_case(dev, tokens=8, seed=5, scale_shape=scale_shape)
    pristine = (case["key_cache"].clone(), case["value_cache"].clone())
    results = []
    for k_scale in (0.5, 4.0, 0.25):
        case["key_cache"].copy_(pristine[0])
        case["value_cache"].copy_(pristine[1])
        case["k_scale"].fill_(k_scale)
        ref_k, ref_v = reference_kv_write(**case)
        kdispatch.write_kv(**case)
        assert torch.equal(case["key_cache"].float(), ref_k)
        assert torch.equal(case["value_cache"].float(), ref_v)
        results.append(case["key_cache"].clone())
    assert not torch.equal(results[0], results[1])


def test_indexed_baseline_quantizes_too(dev):
    case = make_case(dev, tokens=9, seed=2)
    check_write(KVWriteConfig(variant="indexed"), case)


def test_candidates_and_tuning_hooks_for_fp8_keys(dev):
    """make_inputs -> run (heuristic, candidates, the indexed baseline) == reference, for an
    fp8 key; the key reads the cache dtype from the tensors."""
    key = KVWriteKey(**OpKey.device_fields(kdispatch.Device.interpreter()), dtype="bfloat16",
                     kv_dtype="float8_e4m3fn", num_kv_heads=2, head_dim=32, page_size=4,
                     tokens=8, masking="none")
    inputs = SPEC.tuning.make_inputs(key, dev, seed=5)
    assert inputs["key_cache"].dtype == FP8 and inputs["k_scale"] is not None
    assert SPEC.key(kdispatch.Device.interpreter(), inputs) == key
    ref = SPEC.tuning.reference(inputs)
    assert ref[0].abs().max().item() == 448.0  # the tuner's scales saturate some values
    assert SPEC.tuning.tolerance(key) == (0.0, 0.0)
    for cfg in [SPEC.heuristic(key), *list(SPEC.tuning.candidates(key))[:4],
                SPEC.tuning.baseline(key)]:
        out = SPEC.tuning.run(cfg, inputs)
        for o, r in zip(out, ref):
            assert torch.equal(o.float(), r), cfg
    bf16 = key.model_copy(update={"kv_dtype": "bfloat16"})
    assert SPEC.tuning.bytes_moved(key) < SPEC.tuning.bytes_moved(bf16)


def test_torch_op_schema_takes_scales(dev):
    case = make_case(dev, tokens=4, seed=8)
    ref_k, ref_v = reference_kv_write(**case)
    torch.ops.kdispatch.write_kv.full(case["key"], case["value"], case["key_cache"],
                                      case["value_cache"], case["slot_mapping"], None, None,
                                      None, case["k_scale"], case["v_scale"])
    assert torch.equal(case["key_cache"].float(), ref_k)
    assert torch.equal(case["value_cache"].float(), ref_v)


# -- bad input ---------------------------------------------------------------------------------
def _bad_cases(dev):
    base = make_case(dev, tokens=4, seed=0)
    other = "meta" if torch.device(dev).type == "cpu" else "cpu"
    ks = base["k_scale"]
    bf16 = {**base, "key_cache": base["key_cache"].bfloat16(),
            "value_cache": base["value_cache"].bfloat16()}
    yield "k_scale", {**base, "k_scale": ks.to(other)}  # a scale on another device
    yield "v_scale", {**base, "v_scale": base["v_scale"].to(other)}
    yield "k_scale", bf16  # a non-fp8 cache with scales
    yield "k_scale", {**base, "k_scale": None}  # one scale without the other
    yield "v_scale", {**base, "v_scale": None}
    yield "k_scale", {**base, "k_scale": ks.double()}
    yield "k_scale", {**base, "k_scale": torch.ones(2, device=dev)}
    yield "v_scale", {**base, "v_scale": 2.0}
    yield "value_cache", {**base, "value_cache": base["value_cache"].bfloat16()}
    yield "key_cache", {**base, "key_cache": base["key_cache"].to(torch.float8_e5m2)}
    if torch.device(dev).type == "cpu":  # the interpreter has no fnuz type
        yield "key_cache", {**base, "key_cache": base["key_cache"].to(torch.float8_e4m3fnuz),
                            "value_cache": base["value_cache"].to(torch.float8_e4m3fnuz)}


@pytest.mark.parametrize("public", [False, True], ids=["launch", "public"])
def test_bad_fp8_input_names_the_argument(dev, public):
    cases = list(_bad_cases(dev))
    assert len(cases) >= 10
    cfg = KVWriteConfig(block_h=2, num_warps=1)
    for name, case in cases:
        with pytest.raises(ValueError, match=rf"^{name}:"):
            if public:
                kdispatch.write_kv(**case)
            else:
                launch_kv_write(cfg, **case)
