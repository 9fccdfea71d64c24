"""The MLA backend inside the real vLLM: selected through vLLM's registry, decode metadata
built by its builder (vLLM's MLA builder underneath) from vLLM's own common metadata,
``forward_mqa`` on the CPU (Triton interpreter) over the absorbed latent cache, compared with
the fp32 reference and with vLLM's own CPU MLA decode on the same inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import vllm_harness as h  # noqa: E402

h.prepare_process()
pytest.importorskip("vllm", reason=h.SKIP_REASON)

import torch  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend  # noqa: E402
from vllm.v1.attention.backends.mla.prefill.cpu_sdpa import (  # noqa: E402
    CPUSDPAMLAPrefillBackend,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402

import kdispatch  # noqa: E402
import kdispatch.integrations.vllm as plugin  # noqa: E402

CFG = h.TINY_DEEPSEEK
HQ = CFG["num_attention_heads"]
RANK, ROPE, NOPE = CFG["kv_lora_rank"], CFG["qk_rope_head_dim"], CFG["qk_nope_head_dim"]
LATENT = RANK + ROPE
SCALE = (NOPE + ROPE) ** -0.5
LAYER = "model.layers.0.self_attn.attn"
CPU = torch.device("cpu")
# As for GQA: fp32 differs in summation order only; fp16 rounds P and the output to fp16.
# The latent dot products run over 576 columns, so fp32 gets a little more room.
TOL = {torch.float32: {"atol": 5e-5, "rtol": 5e-5},
       torch.float16: {"atol": 2e-3, "rtol": 2e-3}}
DECODE = h.Batch(context=[n - 1 for n in h.RAGGED], query=[1] * len(h.RAGGED))


@pytest.fixture(scope="module")
def backend():
    plugin.register()
    return AttentionBackendEnum[plugin.MLA_NAME].get_class()


def _mla_args() -> dict:
    return dict(q_lora_rank=None, kv_lora_rank=RANK, qk_nope_head_dim=NOPE,
                qk_rope_head_dim=ROPE, qk_head_dim=NOPE + ROPE,
                v_head_dim=CFG["v_head_dim"], kv_b_proj=None)


def _decode(backend_cls, dtype: torch.dtype, batch: h.Batch = DECODE, seed: int = 0,
            written: torch.Tensor | None = None):
    """Builder + impl of ``backend_cls`` as vLLM makes them; write the step's latent rows
    (unless ``written`` already holds them); ``forward_mqa``."""
    gen = torch.Generator().manual_seed(seed)
    vc = h.vllm_config("deepseek", str(dtype).removeprefix("torch."))
    assert vc.model_config.use_mla and vc.model_config.get_head_size() == LATENT
    table = h.random_block_table(batch, h.MAX_MODEL_LEN // h.PAGE, gen)
    cm = h.common_metadata(batch, table)
    cache = h.rand(gen, h.NUM_BLOCKS, h.PAGE, LATENT, dtype=dtype)  # MLA layer's 3-D view
    before = cache.clone()
    t = batch.num_tokens
    kv_c = h.rand(gen, t, RANK, dtype=dtype)
    k_pe = h.rand(gen, t, 1, ROPE, dtype=dtype)
    q = h.rand(gen, t, HQ, LATENT, dtype=dtype)
    spec = MLAAttentionSpec(block_size=h.PAGE, num_kv_heads=1, head_size=LATENT, dtype=dtype)
    with set_current_vllm_config(vc):
        # the attributes vLLM's MLA builder reads from the layer; its prefill backend is
        # the real one vLLM picks on this platform (decode-only batches never call it)
        prefill = CPUSDPAMLAPrefillBackend(
            num_heads=HQ, scale=SCALE, kv_lora_rank=RANK, qk_nope_head_dim=NOPE,
            qk_rope_head_dim=ROPE, v_head_dim=CFG["v_head_dim"], vllm_config=vc)
        vc.compilation_config.static_forward_context[LAYER] = SimpleNamespace(
            prefill_backend=prefill, **{k: v for k, v in _mla_args().items()
                                        if k in ("q_lora_rank", "kv_lora_rank",
                                                 "qk_nope_head_dim", "qk_rope_head_dim",
                                                 "v_head_dim")})
        try:
            builder = backend_cls.get_builder_cls()(spec, [LAYER], vc, CPU)
        finally:
            del vc.compilation_config.static_forward_context[LAYER]
        impl = backend_cls.get_impl_cls()(HQ, LATENT, SCALE, 1, None, None, "auto", None,
                                          "decoder", None, **_mla_args())
    meta = builder.build(0, cm)
    if written is None:
        impl.do_kv_cache_update(kv_c, k_pe, cache, cm.slot_mapping, "auto",
                                torch.ones((), dtype=torch.float32))
    else:
        cache = written.clone()
    out, lse = impl.forward_mqa((q[..., :RANK], q[..., RANK:]), cache, meta, h.ScaleLayer())
    return out, lse, meta, cache, (q, kv_c, k_pe, table, cm, before)


def _selection(backend_cls, **over):
    return h.selection(backend_cls, **{"head_size": LATENT, "dtype": torch.bfloat16,
                                       "block_size": 64, "use_mla": True, **over})


def test_selection_names_what_it_refuses(backend):
    assert backend.is_mla() and backend.get_name() == plugin.MLA_NAME
    assert _selection(backend) == []
    reasons = _selection(backend, kv_cache_dtype="fp8_e4m3")
    assert any("'fp8_e4m3'" in r and "not supported yet" in r for r in reasons), reasons
    reasons = _selection(backend, head_size=640)
    assert any("head size 640" in r for r in reasons), reasons
    assert any("non-MLA" in r for r in _selection(backend, use_mla=False))
    assert any("block size 24" in r for r in _selection(backend, block_size=24))


def test_impl_refuses_at_construction(backend):
    vc = h.vllm_config("deepseek", "float32")
    with set_current_vllm_config(vc), pytest.raises(ValueError, match="'fp8'"):
        backend.get_impl_cls()(HQ, LATENT, SCALE, 1, None, None, "fp8", None, "decoder",
                               None, **_mla_args())
    args = {**_mla_args(), "kv_lora_rank": 300}  # 300 + 64: more than 256 extra columns
    with set_current_vllm_config(vc), pytest.raises(ValueError, match="head sizes q/k 576"):
        backend.get_impl_cls()(HQ, LATENT, SCALE, 1, None, None, "auto", None, "decoder",
                               None, **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ragged_decode_matches_reference_and_vllm_cpu_mla(backend, dtype):
    out, lse, meta, cache, (q, kv_c, k_pe, table, cm, before) = _decode(backend, dtype)
    assert lse is None and out.shape == (len(h.RAGGED), HQ, RANK) and out.dtype == dtype
    assert meta.num_decodes == len(h.RAGGED) and meta.prefill is None
    assert meta.decode.config == kdispatch.resolve(
        "decode_attention", device=kdispatch.Device.from_torch(CPU), batch=len(h.RAGGED),
        context=table.shape[1] * h.PAGE, num_q_heads=HQ, num_kv_heads=1, head_dim=LATENT,
        head_dim_v=RANK, page_size=h.PAGE, dtype=str(dtype).removeprefix("torch."))
    # the latent write: [kv_c | k_pe] at each slot, nothing else touched
    flat = cache.flatten(0, 1)
    slots = cm.slot_mapping
    assert torch.equal(flat[slots], torch.cat([kv_c, k_pe[:, 0]], dim=-1))
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(flat[untouched], before.flatten(0, 1)[untouched])
    rows = [h.gather_rows(cache, table, b, n)[:, None] for b, n in enumerate(DECODE.seq_lens)]
    ref = h.reference_attention(q, rows, [r[..., :RANK] for r in rows], DECODE, SCALE)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    theirs, _, _, _, _ = _decode(CPUMLABackend, dtype, written=cache)
    torch.testing.assert_close(out, theirs, **TOL[dtype])
