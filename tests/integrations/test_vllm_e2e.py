"""End to end: ``vllm.LLM`` on tiny local models, greedy tokens with the kdispatch backends
against vLLM's default CPU attention.

vLLM's CPU platform does not admit any attention backend but its own:
``CpuPlatform.get_attn_backend_cls`` (vllm/platforms/cpu.py) logs "Cannot use
AttentionBackendEnum.CUSTOM backend on CPU." and returns CPU_ATTN (CPU_MLA/AMX_MLA for MLA
models) whatever ``--attention-backend`` says. ``test_cpu_platform_ignores_the_flag`` pins
that behaviour; the comparisons then replace exactly that one selection function, in this
process, with one that honours the flag, and run the real engine (scheduler, model runner,
metadata builders, KV-cache allocation, sampler) around the kdispatch backends.
"""

from __future__ import annotations

import gc

import pytest

import vllm_harness as h  # noqa: E402

h.prepare_process()
pytest.importorskip("vllm", reason=h.SKIP_REASON)

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.selector import _cached_get_attn_backend  # noqa: E402

import kdispatch.integrations.vllm as plugin  # noqa: E402

# page boundaries (16, 32), a one-token prompt (a decode from the first step) and a prompt
# long enough to be chunked over several steps while the others decode
PROMPTS = [[5, 17, 99, 3, 250, 8, 41], list(range(30, 63)), [77], list(range(100, 140))]
MAX_TOKENS = 8
#: fp32 logprobs of the two implementations agree far below this (summation order only)
LOGPROB_ATOL = 1e-4


@pytest.fixture
def admits_kdispatch(monkeypatch):
    """The CPU platform's backend selection, honouring the kdispatch backends."""
    plugin.register()
    refuse = CpuPlatform.get_attn_backend_cls.__func__
    ours = {AttentionBackendEnum.CUSTOM, AttentionBackendEnum[plugin.MLA_NAME]}

    def select(cls, selected_backend, attn_selector_config, num_heads=None):
        if selected_backend in ours:
            return selected_backend.get_path()
        return refuse(cls, selected_backend, attn_selector_config, num_heads)

    monkeypatch.setattr(CpuPlatform, "get_attn_backend_cls", classmethod(select))
    _cached_get_attn_backend.cache_clear()  # vLLM memoizes the platform's answers
    yield
    _cached_get_attn_backend.cache_clear()


def _run(model: str, backend: str | None, **engine: object):
    """Attention impls the model got, and per prompt the greedy tokens with their top-2
    logprobs (``engine``: engine arguments over the chunked-prefill defaults)."""
    engine = {"enable_chunked_prefill": True, "max_num_batched_tokens": 32, **engine}
    llm = LLM(model=h.model_dir(model), skip_tokenizer_init=True, dtype="float32",
              enforce_eager=True, max_model_len=h.MAX_MODEL_LEN, max_num_seqs=4, seed=0,
              gpu_memory_utilization=0.3, attention_backend=backend, **engine)
    try:
        impls = llm.apply_model(lambda m: sorted({type(mod.impl).__name__
                                                  for mod in m.modules()
                                                  if hasattr(mod, "impl")}))[0]
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=2)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                            use_tqdm=False)
        result = [(list(o.outputs[0].token_ids),
                   [sorted((v.logprob for v in step.values()), reverse=True)
                    for step in o.outputs[0].logprobs]) for o in outs]
    finally:
        del llm
        gc.collect()
    return impls, result


def _same_generation(ours, theirs):
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(ours, theirs, strict=True):
        assert tokens == ref_tokens
        assert len(tokens) == MAX_TOKENS
        for step, ref_step in zip(logprobs, ref_logprobs, strict=True):
            assert step == pytest.approx(ref_step, abs=LOGPROB_ATOL)
    # the comparison means something: the greedy choice was never a near tie
    margins = [lp[0] - lp[1] for _, lps in theirs for lp in lps]
    assert min(margins) > 10 * LOGPROB_ATOL, margins


def test_cpu_platform_ignores_the_flag():
    plugin.register()
    impls, _ = _run("llama", "CUSTOM")
    assert impls == ["CPUAttentionBackendImpl"]


def test_llama_greedy_tokens_match_default_cpu_attention(admits_kdispatch):
    ours_impls, ours = _run("llama", "CUSTOM")
    assert ours_impls == ["KDispatchAttentionImpl"]
    ref_impls, theirs = _run("llama", None)
    assert ref_impls == ["CPUAttentionBackendImpl"]
    _same_generation(ours, theirs)


#: vLLM's CPU MLA runs without chunked prefill or prefix caching (the CPU platform turns
#: both off for MLA models, except where it expects its AMX MLA backend: on a CPU with AMX
#: tiles, for any backend but CPU_MLA, and there its SDPA prefill then gives other tokens
#: for a prompt batched with another prompt's prefill than for that prompt alone). Both
#: runs get the reference's settings on every CPU.
MLA_ENGINE = {"enable_chunked_prefill": False, "enable_prefix_caching": False,
              "max_num_batched_tokens": 2048}


def test_deepseek_mla_greedy_tokens_match_default_cpu_mla(admits_kdispatch):
    ours_impls, ours = _run("deepseek", plugin.MLA_NAME, **MLA_ENGINE)
    assert ours_impls == ["KDispatchMLAImpl"]
    # vLLM's reference CPU MLA by name: on a CPU with AMX tiles the platform's default is
    # its AMX MLA backend, which takes only bf16/fp16/int8/fp8 weights, not this fp32 model
    ref_impls, theirs = _run("deepseek", "CPU_MLA", **MLA_ENGINE)
    assert ref_impls == ["CPUMLAImpl"]
    _same_generation(ours, theirs)
