"""kv_write kernels against the fp32 reference (CPU: Triton interpreter; GPU: the device).

Every comparison is element for element over the entire K and V pools, which are
pre-filled with random values, so a stray write or a missed row shows up anywhere.
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.kernels.kv_write import OP as SPEC
from kdispatch.kernels.kv_write import (
    KVWriteConfig,
    KVWriteKey,
    launch_kv_write,
    reference_kv_write,
)
from kdispatch.opdef import OpKey
from kernel_checks import check_write, write_masks
from kernel_checks import rand_nonzero as _rand

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEADS, DIM, PAGE, BLOCKS = 3, 24, 4, 40  # odd heads, non-pow2 dim: both masked tails


def make_case(device, *, tokens: int, dtype=torch.bfloat16, heads: int = HEADS, dim: int = DIM,
              page: int = PAGE, blocks: int = BLOCKS, seed: int = 0, negative: int = 0,
              slot_dtype=torch.int64, first_last: bool = False, strided: bool = True,
              v_cache_layout: str = "flash") -> dict:
    """K/V as views of one qkv projection, random pools, unique random slots."""
    gen = torch.Generator().manual_seed(seed)
    hd = heads * dim
    if strided:
        qkv = _rand(gen, tokens, 3 * hd, dtype=dtype, device=device)
        key = qkv[:, hd:2 * hd].view(tokens, heads, dim)
        value = qkv[:, 2 * hd:].view(tokens, heads, dim)
    else:
        key = _rand(gen, tokens, heads, dim, dtype=dtype, device=device)
        value = _rand(gen, tokens, heads, dim, dtype=dtype, device=device)
    key_cache = _rand(gen, blocks, page, heads, dim, dtype=dtype, device=device)
    if v_cache_layout == "flash":
        value_cache = _rand(gen, blocks, page, heads, dim, dtype=dtype, device=device)
    else:  # stored [blocks, heads, page, dim], viewed as [blocks, page, heads, dim]
        value_cache = _rand(gen, blocks, heads, page, dim, dtype=dtype,
                            device=device).permute(0, 2, 1, 3)
    num_slots = blocks * page
    assert tokens <= num_slots - 2
    slots = torch.randperm(num_slots - 2, generator=gen)[:tokens] + 1
    if first_last:
        slots[0] = 0
        slots[-1] = num_slots - 1
    if negative:
        slots[torch.randperm(tokens, generator=gen)[:negative]] = -1
    return {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
            "slot_mapping": slots.to(slot_dtype).to(device)}


def heuristic_for(case: dict, row_mask=None, active_rows=None) -> KVWriteConfig:
    return kdispatch.resolve("kv_write", **case, row_mask=row_mask, active_rows=active_rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("tokens", [1, 15, 16, 17, 63, 64, 65])
def test_fused_matches_reference(dev, dtype, tokens):
    case = make_case(dev, tokens=tokens, dtype=dtype, seed=tokens, first_last=tokens > 1,
                     negative=tokens // 4)
    before = case["key_cache"].clone()
    check_write(heuristic_for(case), case)
    # the reference itself moved: the written rows differ from the pre-filled pool
    assert not torch.equal(case["key_cache"], before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("masking", ["row_mask", "active_rows", "both"])
def test_masked_forms(dev, dtype, masking):
    tokens = 17
    case = make_case(dev, tokens=tokens, dtype=dtype, seed=3, negative=2, first_last=True)
    row_mask, active_rows = write_masks(dev, tokens, masking)
    check_write(heuristic_for(case, row_mask, active_rows), case, row_mask, active_rows)


@pytest.mark.parametrize("count", [0, 1, 9, 16, 17, 100])
def test_active_row_counts(dev, count):
    case = make_case(dev, tokens=17, seed=count, first_last=True)
    active = torch.tensor([count], dtype=torch.int32, device=dev)
    before_k = case["key_cache"].clone()
    check_write(heuristic_for(case, active_rows=active), case, active_rows=active)
    if count == 0:
        assert torch.equal(case["key_cache"], before_k)


def test_row_mask_all_false_writes_nothing(dev):
    case = make_case(dev, tokens=16, seed=5)
    mask = torch.zeros(16, dtype=torch.bool, device=dev)
    before = (case["key_cache"].clone(), case["value_cache"].clone())
    launch_kv_write(heuristic_for(case, mask), **case, row_mask=mask)
    assert torch.equal(case["key_cache"], before[0])
    assert torch.equal(case["value_cache"], before[1])


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_first_and_last_slot_and_strided_caches(dev, slot_dtype):
    case = make_case(dev, tokens=5, seed=11, slot_dtype=slot_dtype, first_last=True,
                     v_cache_layout="heads_major")
    assert case["value_cache"].stride() != case["key_cache"].stride()
    slots = case["slot_mapping"]
    assert int(slots[0]) == 0 and int(slots[-1]) == BLOCKS * PAGE - 1
    check_write(heuristic_for(case), case)
    torch.testing.assert_close(case["key_cache"][-1, -1], case["key"][-1], atol=0, rtol=0)
    torch.testing.assert_close(case["value_cache"][0, 0], case["value"][0], atol=0, rtol=0)


@pytest.mark.parametrize("heads,dim,page", [(1, 1, 1), (4, 128, 16), (2, 576, 2)])
def test_shapes(dev, heads, dim, page):
    case = make_case(dev, tokens=6, heads=heads, dim=dim, page=page, blocks=8, seed=heads,
                     strided=False, negative=1)
    check_write(heuristic_for(case), case)


def test_every_candidate_gives_identical_pools(dev):
    """All tuner candidates for a small key write the same pools as the reference."""
    case = make_case(dev, tokens=8, heads=HEADS, dim=DIM, seed=21, negative=2, first_last=True)
    mask = torch.tensor([True, True, False, True, True, True, False, True], device=dev)
    key = SPEC.key(kdispatch.Device.interpreter(), {**case, "row_mask": mask})
    candidates = list(SPEC.tuning.candidates(key))
    assert len(candidates) >= 8
    assert {c.block_h for c in candidates} >= {1, 2, 4} and {c.block_t for c in candidates} >= {1, 8}
    ref_k, ref_v = reference_kv_write(**case, row_mask=mask)
    pristine = (case["key_cache"].clone(), case["value_cache"].clone())
    for cfg in candidates:
        case["key_cache"].copy_(pristine[0])
        case["value_cache"].copy_(pristine[1])
        launch_kv_write(cfg, **case, row_mask=mask)
        assert torch.equal(case["key_cache"].float(), ref_k), cfg
        assert torch.equal(case["value_cache"].float(), ref_v), cfg


@pytest.mark.parametrize("layout", ["flash", "heads_major"])
def test_indexed_baseline_matches_reference(dev, layout):
    case = make_case(dev, tokens=9, seed=2, first_last=True, v_cache_layout=layout)
    check_write(KVWriteConfig(variant="indexed"), case)


def test_public_write_kv_resolves_fused_heuristic(dev):
    case = make_case(dev, tokens=16, seed=4, negative=3)
    exp = kdispatch.explain("kv_write", **case, row_mask=None, active_rows=None)
    assert exp.provenance == "heuristic" and exp.config.variant == "fused"
    ref_k, ref_v = reference_kv_write(**case)
    kdispatch.write_kv(**case)
    assert torch.equal(case["key_cache"].float(), ref_k)
    assert torch.equal(case["value_cache"].float(), ref_v)


def test_zero_tokens_is_a_no_op(dev):
    case = make_case(dev, tokens=4, seed=1)
    empty = {**case, "key": case["key"][:0], "value": case["value"][:0],
             "slot_mapping": case["slot_mapping"][:0]}
    before = case["key_cache"].clone()
    kdispatch.write_kv(**empty)
    assert torch.equal(case["key_cache"], before)


@pytest.mark.parametrize("masking", ["none", "row_mask", "active_rows", "both"])
def test_spec_run_matches_reference(dev, masking):
    """The tuner's hooks: make_inputs -> run (heuristic and every fused candidate) == reference."""
    key = KVWriteKey(**OpKey.device_fields(kdispatch.Device.interpreter()), dtype="bfloat16",
                     num_kv_heads=2, head_dim=32, page_size=4, tokens=8, masking=masking)
    inputs = SPEC.tuning.make_inputs(key, dev, seed=5)
    assert SPEC.key(kdispatch.Device.interpreter(), inputs) == key
    ref = SPEC.tuning.reference(inputs)
    configs = [SPEC.heuristic(key), *list(SPEC.tuning.candidates(key))[:6]]
    if masking == "none":
        configs.append(SPEC.tuning.baseline(key))
    for cfg in configs:
        out = SPEC.tuning.run(cfg, inputs)
        atol, rtol = SPEC.tuning.tolerance(key)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o.float(), r, atol=atol, rtol=rtol)
    # the write did something: the reference differs from the pristine pool
    assert not torch.equal(ref[0], inputs["initial_key_cache"].float())


def test_reference_does_not_modify_inputs(dev):
    case = make_case(dev, tokens=4, seed=9)
    before = case["key_cache"].clone()
    k_pool, _ = reference_kv_write(**case)
    assert torch.equal(case["key_cache"], before)
    assert k_pool.dtype == torch.float32 and not torch.equal(k_pool, before.float())


# -- bad input --------------------------------------------------------------------------------
def _bad_cases(dev):
    c = lambda **kw: make_case(dev, tokens=4, seed=0, **kw)  # noqa: E731
    base = c()
    yield "value", {**base, "key": base["key"].to(torch.float16)}, {}  # value dtype != key's
    yield "key_cache", {**base, "key": base["key"].to(torch.float16),
                        "value": base["value"].to(torch.float16)}, {}  # cache dtype != key's
    yield "value", {**base, "value": base["value"][:3]}, {}
    yield "value", {**base, "value": base["value"].to(torch.float16)}, {}
    yield "key", {**base, "key": base["key"].transpose(1, 2)}, {}  # last dim not contiguous
    yield "value", {**base, "value": base["value"][..., ::2]}, {}
    yield "key", {**base, "key": base["key"].to(torch.int32)}, {}
    yield "key", {**base, "key": base["key"].reshape(4, -1)}, {}
    yield "key_cache", {**base, "key_cache": base["key_cache"].flatten(0, 1)}, {}
    yield "key_cache", {**base, "key_cache": base["key_cache"].transpose(1, 2)}, {}
    yield "value_cache", {**base, "value_cache": base["value_cache"][:5]}, {}
    yield "value_cache", {**base, "value_cache": base["value_cache"].float()}, {}
    yield "value_cache", {**base, "value_cache": base["value_cache"][..., ::2]}, {}
    yield "slot_mapping", {**base, "slot_mapping": base["slot_mapping"].float()}, {}
    yield "slot_mapping", {**base, "slot_mapping": base["slot_mapping"][:3]}, {}
    yield "slot_mapping", {**base, "slot_mapping": base["slot_mapping"].view(2, 2)}, {}
    yield "row_mask", base, {"row_mask": torch.ones(4, dtype=torch.int32, device=dev)}
    yield "row_mask", base, {"row_mask": torch.ones(5, dtype=torch.bool, device=dev)}
    yield "active_rows", base, {"active_rows": torch.tensor([2], device=dev)}  # int64
    yield "active_rows", base, {"active_rows": torch.tensor([2, 3], dtype=torch.int32,
                                                            device=dev)}
    yield "key_cache", {**base, "key_cache": None}, {}
    other = "meta" if torch.device(dev).type == "cpu" else "cpu"
    yield "key_cache", {**base, "key_cache": base["key_cache"].to(other)}, {}
    yield "slot_mapping", {**base, "slot_mapping": base["slot_mapping"].to(other)}, {}


N_BAD = 23


def test_bad_case_count(dev):
    assert len(list(_bad_cases(dev))) == N_BAD


@pytest.mark.parametrize("idx", range(N_BAD))
def test_bad_input_names_the_argument(dev, idx):
    name, case, extra = list(_bad_cases(dev))[idx]
    cfg = KVWriteConfig(variant="fused", block_h=2, block_t=1, num_warps=1)
    with pytest.raises(ValueError, match=rf"^{name}:"):
        launch_kv_write(cfg, **case, **extra)


def test_indexed_with_masking_is_rejected(dev):
    case = make_case(dev, tokens=4, seed=0)
    mask = torch.ones(4, dtype=torch.bool, device=dev)
    with pytest.raises(ValueError, match="^config:"):
        launch_kv_write(KVWriteConfig(variant="indexed"), **case, row_mask=mask)
    with pytest.raises(ValueError, match="^config:"):
        kdispatch.write_kv(**case, row_mask=mask, config={"variant": "indexed"})
    with pytest.raises(ValueError, match="^config:"):
        launch_kv_write({"variant": "fused"}, **case)


def test_pdl_config_runs_where_supported_and_is_refused_elsewhere(dev):
    """pdl=True: identical pools on an sm_90+ GPU; a ValueError naming config elsewhere."""
    from kdispatch.kernels._common import supports_pdl

    case = make_case(dev, tokens=17, seed=5, negative=2, first_last=True)
    cfg = KVWriteConfig(variant="fused", block_h=2, block_t=1, num_warps=2, pdl=True)
    if supports_pdl(case["key"].device):
        check_write(cfg, case)
    else:
        with pytest.raises(ValueError, match="^config: pdl=True needs"):
            launch_kv_write(cfg, **case)
