"""The GQA/MHA backend inside the real vLLM: selected through vLLM's registry, metadata built
by its builder from vLLM's own common metadata, forward on the CPU (Triton interpreter),
compared with the fp32 reference and with vLLM's own Triton attention on the same inputs."""

from __future__ import annotations

import pytest

import vllm_harness as h  # noqa: E402

h.prepare_process()
pytest.importorskip("vllm", reason=h.SKIP_REASON)

import torch  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec  # noqa: E402

import kdispatch  # noqa: E402
import kdispatch.integrations.vllm as plugin  # noqa: E402

HQ, HK, D = 4, 2, 32
LAYER = "model.layers.0.self_attn.attn"
CPU = torch.device("cpu")
# fp32: both sides accumulate in fp32 and differ only in summation order and exp2 vs exp
# (~1e-6 relative on outputs of magnitude <= 1.25). fp16: the output is rounded to fp16
# (2^-11 relative) and the kernels round P to fp16 before the PV product (~1e-3 absolute).
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5},
       torch.float16: {"atol": 2e-3, "rtol": 2e-3}}
DECODE = h.Batch(context=[n - 1 for n in h.RAGGED], query=[1] * len(h.RAGGED))
# decodes first (vLLM reorders with reorder_batch_threshold = 1), then a chunked-prefill
# chunk with context, a fresh prompt, and a chunk that crosses two page boundaries
MIXED = h.Batch(context=[0, 15, 16, 32, 15, 0, 9], query=[1, 1, 1, 1, 3, 20, 30])


@pytest.fixture(scope="module")
def backend():
    plugin.register()
    return AttentionBackendEnum.CUSTOM.get_class()


def _spec(dtype: torch.dtype, window: int | None):
    if window is None:
        return FullAttentionSpec(block_size=h.PAGE, num_kv_heads=HK, head_size=D, dtype=dtype)
    return SlidingWindowSpec(block_size=h.PAGE, num_kv_heads=HK, head_size=D, dtype=dtype,
                             sliding_window=window)


def _cache(gen: torch.Generator, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """vLLM's per-layer cache view [num_blocks, Hk, page, 2 * D] in a physical layout:
    NHD (vLLM's default LBNHC, page-major) or HND (head-major)."""
    if layout == "NHD":
        return h.rand(gen, h.NUM_BLOCKS, h.PAGE, HK, 2 * D, dtype=dtype).transpose(1, 2)
    return h.rand(gen, h.NUM_BLOCKS, HK, h.PAGE, 2 * D, dtype=dtype)


def _step(backend_cls, batch: h.Batch, dtype: torch.dtype, *, layout: str = "NHD",
          window: int | None = None, softcap: float = 0.0, seed: int = 0,
          written: torch.Tensor | None = None):
    """Build ``backend_cls``'s builder and impl as vLLM does, write this step's K/V, run
    forward. Returns (output, metadata, the cache after the step, the inputs).

    ``written``: a cache that already holds this step's K/V (vLLM's own writer calls
    ``torch.cuda`` and cannot run here): forward runs on a copy of it, same draws."""
    gen = torch.Generator().manual_seed(seed)
    vc = h.vllm_config("llama", str(dtype).removeprefix("torch."))
    table = h.random_block_table(batch, h.MAX_MODEL_LEN // h.PAGE, gen)
    cm = h.common_metadata(batch, table)
    kv = _cache(gen, dtype, layout)
    before = kv.clone()
    t = batch.num_tokens
    q, k, v = (h.rand(gen, t, n, D, dtype=dtype) for n in (HQ, HK, HK))
    with set_current_vllm_config(vc):
        builder = backend_cls.get_builder_cls()(_spec(dtype, window), [LAYER], vc, CPU)
        impl = backend_cls.get_impl_cls()(HQ, D, D ** -0.5, HK, None, window, "auto",
                                          softcap or None)
    meta = builder.build(0, cm)
    layer = h.ScaleLayer()
    if written is None:
        impl.do_kv_cache_update(layer, k, v, kv, cm.slot_mapping)
    else:
        kv = written.clone()
    out = torch.full((t, HQ, D), float("nan"), dtype=dtype)
    impl.forward(layer, q, k, v, kv, meta, out)
    return out, meta, kv, (q, k, v, table, cm, before)


def _reference(batch, q, kv, table, window=None, softcap=0.0):
    k_cache, v_cache = kv.transpose(1, 2).split(D, dim=-1)
    keys = [h.gather_rows(k_cache, table, b, n) for b, n in enumerate(batch.seq_lens)]
    values = [h.gather_rows(v_cache, table, b, n) for b, n in enumerate(batch.seq_lens)]
    return h.reference_attention(q, keys, values, batch, D ** -0.5, window, softcap)


def test_registry_serves_the_kdispatch_backends(backend):
    from kdispatch.integrations.vllm.backend import KDispatchAttentionBackend
    from kdispatch.integrations.vllm.mla import KDispatchMLABackend

    assert backend is KDispatchAttentionBackend
    assert AttentionBackendEnum[plugin.MLA_NAME].get_class() is KDispatchMLABackend
    plugin.register()  # vLLM may load plugins again: idempotent
    assert AttentionBackendEnum.CUSTOM.get_class() is KDispatchAttentionBackend
    vc = h.vllm_config("llama", "float32", attention_backend="CUSTOM")
    assert vc.attention_config.backend is AttentionBackendEnum.CUSTOM


def test_custom_slot_holds_the_mla_backend_on_request(monkeypatch):
    from kdispatch.integrations.vllm.backend import KDispatchAttentionBackend
    from kdispatch.integrations.vllm.mla import KDispatchMLABackend

    monkeypatch.setenv(plugin.CUSTOM_ENV, "mla")  # for vLLM processes started by spawn
    plugin.register()
    try:
        assert AttentionBackendEnum.CUSTOM.get_class() is KDispatchMLABackend
        assert AttentionBackendEnum[plugin.MLA_NAME].get_class() is KDispatchMLABackend
    finally:
        monkeypatch.delenv(plugin.CUSTOM_ENV)
        plugin.register()
    assert AttentionBackendEnum.CUSTOM.get_class() is KDispatchAttentionBackend


def test_selection_names_what_it_refuses(backend):
    assert h.selection(backend, head_size=D) == []
    assert h.selection(backend, head_size=128, dtype=torch.bfloat16, block_size=64) == []
    reasons = h.selection(backend, head_size=640)
    assert any("head size 640" in r for r in reasons), reasons
    assert "head_size not supported" not in reasons  # vLLM's generic wording is replaced
    reasons = h.selection(backend, head_size=D, kv_cache_dtype="fp8")
    assert any("'fp8'" in r and "not supported yet" in r for r in reasons), reasons
    reasons = h.selection(backend, head_size=16)
    assert any("head size 16" in r and "Triton" in r for r in reasons), reasons
    assert any("MLA" in r for r in h.selection(backend, head_size=D, use_mla=True))
    assert any("block size 8" in r for r in h.selection(backend, head_size=D, block_size=8))
    assert h.selection(backend, head_size=D, block_size=48) == []  # split into 16-token pages


def test_impl_refuses_at_construction_not_forward(backend):
    with pytest.raises(ValueError, match="kv-cache dtype 'fp8_e4m3'.*not supported yet"):
        backend.get_impl_cls()(HQ, D, D ** -0.5, HK, None, None, "fp8_e4m3")
    with pytest.raises(ValueError, match="head size 600"):
        backend.get_impl_cls()(HQ, 600, 0.1, HK, None, None, "auto")
    with pytest.raises(ValueError, match="ALiBi"):
        backend.get_impl_cls()(HQ, D, D ** -0.5, HK, [0.5] * HQ, None, "auto")


def test_declares_uniform_single_token_decode_graphs(backend):
    vc = h.vllm_config("llama", "float32")
    support = backend.get_builder_cls().get_cudagraph_support(vc, _spec(torch.float32, None))
    assert support is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ragged_decode_matches_reference_and_vllm_triton(backend, dtype, layout):
    out, meta, kv, (q, k, v, table, cm, before) = _step(backend, DECODE, dtype, layout=layout)
    assert (meta.num_decodes, meta.num_prefills, meta.prefill) == (len(h.RAGGED), 0, None)
    # the KV write: each new row at its slot, nothing else touched
    k_cache, v_cache = kv.transpose(1, 2).split(D, dim=-1)
    flat_k = k_cache.flatten(0, 1)
    flat_v = v_cache.flatten(0, 1)
    slots = cm.slot_mapping
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots] = False
    prev_k, _ = before.transpose(1, 2).split(D, dim=-1)
    assert torch.equal(flat_k[untouched], prev_k.flatten(0, 1)[untouched])
    ref = _reference(DECODE, q, kv, table)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    vllm_out, _, _, _ = _step(TritonAttentionBackend, DECODE, dtype, layout=layout,
                              written=kv)
    torch.testing.assert_close(out, vllm_out, **TOL[dtype])


def test_decode_config_comes_from_block_table_width_not_lengths(backend):
    _, meta, _, (q, _, _, table, _, _) = _step(backend, DECODE, torch.float32)
    expect = kdispatch.resolve(
        "decode_attention", device=kdispatch.Device.from_torch(CPU), batch=len(h.RAGGED),
        context=table.shape[1] * h.PAGE, num_q_heads=HQ, num_kv_heads=HK, head_dim=D,
        head_dim_v=D, page_size=h.PAGE, dtype="float32")
    assert meta.decode_config == expect
    short = h.Batch(context=[0] * len(h.RAGGED), query=[1] * len(h.RAGGED))
    _, meta_short, _, _ = _step(backend, short, torch.float32)
    assert meta_short.decode_config == meta.decode_config


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixed_batch_delegates_prefill_to_vllm_triton(backend, dtype):
    out, meta, kv, (q, _, _, table, _, _) = _step(backend, MIXED, dtype, seed=1)
    assert (meta.num_decodes, meta.num_decode_tokens, meta.num_prefills) == (4, 4, 3)
    assert meta.prefill is not None and meta.prefill.num_actual_tokens == 53
    torch.testing.assert_close(out.float(), _reference(MIXED, q, kv, table), **TOL[dtype])
    vllm_out, _, _, _ = _step(TritonAttentionBackend, MIXED, dtype, seed=1, written=kv)
    torch.testing.assert_close(out, vllm_out, **TOL[dtype])


def test_sliding_window_and_softcap_decode(backend):
    window, cap = 8, 2.0
    out, _, kv, (q, _, _, table, _, _) = _step(backend, DECODE, torch.float32, window=window,
                                            softcap=cap, seed=2)
    ref = _reference(DECODE, q, kv, table, window=window, softcap=cap)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    # and the window really changes the result for the long rows
    full = _reference(DECODE, q, kv, table, softcap=cap)
    assert (full[-1] - ref[-1]).abs().max() > 1e-3
