"""Model presets expand to real op keys on the H200 record and the interpreter."""

from __future__ import annotations

import pytest

from kdispatch.device import Device
from kdispatch.registry import get_op
from kdispatch.tuning import presets, sweep

REQUIRED = ("ouro-1.4b", "huginn", "llama3-8b", "llama3.2-1b", "gemma2-9b", "kimi-k3-tp8",
            "deepseek-v3-tp8", "smoke")


def _keys(name, device, op):
    targets, notes = sweep.plan(device, [name], [op])
    return [t.key for t in targets], notes


def test_required_presets_exist_and_are_bf16_page16():
    assert set(REQUIRED) <= set(presets.preset_names())
    for name in REQUIRED:
        model = presets.get_preset(name).model
        assert model.dtype == "bfloat16" and model.page_size == 16
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        presets.get_preset("nope")


@pytest.mark.parametrize("name", REQUIRED)
def test_every_preset_plans_on_the_h200(name):
    targets, notes = sweep.plan(Device.from_key("nvidia-h200"), [name])
    assert targets
    for t in targets:
        spec = get_op(t.op)
        key = spec.parse_key(t.key)
        assert key.device == "nvidia-h200"
        assert sweep.candidate_list(spec, key)[0][1] == "heuristic"  # heuristic first


def test_preset_shapes_match_benchmarking_md():
    h200 = Device.from_key("nvidia-h200")
    gqa, _ = _keys("llama3-8b", h200, "decode_attention")
    pairs = {(k["batch"], k["num_q_heads"], k["num_kv_heads"], k["head_dim"]) for k in gqa}
    assert pairs == {(b, 32, 8, 128) for b in (1, 8, 64, 4)}
    assert any(k["batch"] == 4 and k["context"] >= 262144 for k in gqa)
    # every shape with the model's bf16 cache and an fp8 one; MLA also with two query
    # tokens per request (BENCHMARKING.md: fp8 and 2-token rows)
    fp8 = "float8_e4m3fn"
    assert len(gqa) == 20 and {(k["kv_dtype"], k["q_len"]) for k in gqa} == {
        ("bfloat16", 1), (fp8, 1)}
    kimi, _ = _keys("kimi-k3-tp8", h200, "decode_attention")
    assert {(k["num_q_heads"], k["num_kv_heads"], k["head_dim"], k["head_dim_v"], k["batch"])
            for k in kimi} == {(12, 1, 576, 512, b) for b in (1, 8)} and len(kimi) == 16
    assert {(k["kv_dtype"], k["q_len"]) for k in kimi} == {
        (kv, q) for kv in ("bfloat16", fp8) for q in (1, 2)}
    ds, _ = _keys("deepseek-v3-tp8", h200, "decode_attention")
    assert {(k["num_q_heads"], k["batch"]) for k in ds} == {(16, 8), (16, 32)} and len(ds) == 16
    ouro_kv, _ = _keys("ouro-1.4b", h200, "kv_write")
    for kv in ("bfloat16", fp8):
        assert sorted(k["tokens"] for k in ouro_kv if k["kv_dtype"] == kv) == [1, 8, 64, 16384]
    assert {(k["num_kv_heads"], k["head_dim"]) for k in ouro_kv} == {(16, 128)}
    ouro_dec, _ = _keys("ouro-1.4b", h200, "decode_attention")
    assert {(k["num_q_heads"], k["num_kv_heads"], k["batch"]) for k in ouro_dec} == {
        (16, 16, 1), (16, 16, 8)}
    # GQA at every head dim issue 18 names: 64, 96 (huginn), 128 and 256
    for name, hq, d in (("llama3.2-1b", 32, 64), ("gemma2-9b", 16, 256)):
        dec, _ = _keys(name, h200, "decode_attention")
        assert {(k["num_q_heads"], k["num_kv_heads"], k["head_dim"], k["head_dim_v"])
                for k in dec} == {(hq, 8, d, d)} and len(dec) == 14
        assert any(k["batch"] == 4 and k["context"] == 262144 for k in dec)
    hug_kv, _ = _keys("huginn", h200, "kv_write")
    assert {(k["num_kv_heads"], k["head_dim"]) for k in hug_kv} == {(55, 96)}


def test_deepseek_dp_preset_is_the_128_head_layout_on_64_token_pages():
    """Issue 18's layout: all 128 heads on one GPU, batch 32 and 128, contexts up to twice
    the ragged means 4k-32k, one and two query tokens, bf16 and fp8 latents; every key plans
    on the H200 with a valid heuristic that fits the partials budget."""
    h200 = Device.from_key("nvidia-h200")
    dec, _ = _keys("deepseek-v3-dp", h200, "decode_attention")
    assert {(k["num_q_heads"], k["head_dim"], k["head_dim_v"], k["page_size"]) for k in dec} == {
        (128, 576, 512, 64)}
    assert {(k["batch"], k["context"]) for k in dec} == {
        (b, c) for b in (32, 128) for c in (8192, 16384, 32768, 65536)}
    assert {(k["kv_dtype"], k["q_len"]) for k in dec} == {
        (kv, q) for kv in ("bfloat16", "float8_e4m3fn") for q in (1, 2)} and len(dec) == 32
    spec = get_op("decode_attention")
    for k in dec:
        key = spec.parse_key(k)
        assert spec.is_valid(key, spec.heuristic(key)), k
    writes, _ = _keys("deepseek-v3-dp", h200, "kv_write")
    assert {(k["num_kv_heads"], k["head_dim"], k["page_size"]) for k in writes} == {(1, 576, 64)}


def test_smoke_is_small():
    targets, notes = sweep.plan(Device.interpreter(), ["smoke"])
    ops = [t.op for t in targets]
    assert ops.count("kv_write") == 2 and 1 <= ops.count("decode_attention") <= 2
    assert all(t.max_candidates and t.max_candidates <= 4 for t in targets)
    assert all(t.key.get("context", 0) <= 64 and t.key.get("tokens", 0) <= 8 for t in targets)
