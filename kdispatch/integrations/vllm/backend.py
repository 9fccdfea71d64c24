"""The GQA/MHA attention backend: kdispatch decode, vLLM's Triton attention for the rest.

* KV write: every token's K/V goes into the paged cache through ``kdispatch.write_kv`` at
  ``slot_mapping`` (negative slots, vLLM's padding, are skipped by the kernel).
* Decode: the batch is reordered so that single-token requests come first
  (``reorder_batch_threshold = 1``); their attention runs in ``kdispatch.decode_attention``
  with a config resolved once per step in the metadata builder from host-known shapes
  (block-table width x page size, the decode count, head counts and dims), never from the
  live sequence lengths.
* Everything else (prefill, chunked-prefill chunks longer than one token, speculative
  multi-token verification) is delegated, for those tokens only, to vLLM's own
  ``TritonAttentionImpl`` over the same cache: the cache layout is vLLM's
  ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (K then V), which both read.

CUDA graphs: ``UNIFORM_SINGLE_TOKEN_DECODE``. A full graph is captured only for batches of
single-token decodes, which are kdispatch launches whose grids and constexprs depend on
shapes alone; mixed batches run the attention eagerly (piecewise graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kdispatch.integrations.vllm import GQA_SLOT, limits, require_vllm

require_vllm()

import torch  # noqa: E402
from vllm import envs  # noqa: E402
from vllm.v1.attention.backend import (  # noqa: E402
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.triton_attn import (  # noqa: E402
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import (  # noqa: E402
    get_num_attention_heads_from_layers,
    split_decodes_and_prefills,
)

import kdispatch  # noqa: E402
from kdispatch.integrations.vllm.common import (  # noqa: E402
    SELECTION_GENERIC_REASONS,
    resolve_decode_config,
)


@dataclass
class KDispatchAttentionMetadata:
    """One step's metadata, shared by the layers of a KV-cache group.

    Rows ``[0, num_decodes)`` are single-token decodes (one query row each) served by
    kdispatch with ``decode_config``; query rows ``[num_decode_tokens, num_actual_tokens)``
    belong to the other requests and are served by vLLM's Triton attention with
    ``prefill`` (its own metadata for that slice of the batch).
    """

    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    decode_config: Any = None
    prefill: TritonAttentionMetadata | None = None


class KDispatchAttentionMetadataBuilder(AttentionMetadataBuilder[KDispatchAttentionMetadata]):
    """Splits each batch into kdispatch decodes and the rest, and resolves the decode
    config from shapes."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    reorder_batch_threshold: int | None = 1

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=False)
        model_config = vllm_config.model_config
        self.num_q_heads = (get_num_attention_heads_from_layers(vllm_config, layer_names)
                            or model_config.get_num_attention_heads(
                                vllm_config.parallel_config))
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_size = kv_cache_spec.head_size
        self.page_size = kv_cache_spec.block_size
        self.q_dtype = model_config.dtype
        self.kv_dtype = kv_cache_spec.dtype
        self.sliding_window = getattr(kv_cache_spec, "sliding_window", None)
        self.batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)
        self.kd_device = kdispatch.Device.from_torch(device)
        # vLLM's own builder for the tokens kdispatch does not take (its scratch buffers are
        # allocated here, so vLLM's memory profiling sees them)
        self.prefill_builder = TritonAttentionMetadataBuilder(
            kv_cache_spec, layer_names, vllm_config, device)

    def decode_config(self, num_decodes: int, block_table: torch.Tensor) -> Any:
        """The kdispatch config for ``num_decodes`` rows of a ``block_table`` this wide."""
        return resolve_decode_config(
            self.kd_device, batch=num_decodes,
            context=block_table.shape[1] * self.page_size, num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_size,
            head_dim_v=self.head_size, page_size=self.page_size, dtype=self.q_dtype,
            kv_dtype=self.kv_dtype, sliding_window=self.sliding_window,
            batch_invariant=self.batch_invariant)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> KDispatchAttentionMetadata:
        cm = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            cm, decode_threshold=1)
        block_table = cm.block_table_tensor
        meta = KDispatchAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens, num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens, num_prefills=num_prefills,
            block_table=block_table, seq_lens=cm.seq_lens, slot_mapping=cm.slot_mapping)
        if num_decodes:
            meta.decode_config = self.decode_config(num_decodes, block_table)
        if num_prefills:
            meta.prefill = self.prefill_builder.build(
                common_prefix_len, _tail_requests(cm, num_decodes, num_decode_tokens),
                fast_build)
        return meta


def _tail_requests(cm: CommonAttentionMetadata, first: int,
                   first_token: int) -> CommonAttentionMetadata:
    """vLLM's common metadata of requests ``[first, num_reqs)`` alone (the prefills)."""
    end = cm.num_reqs
    qsl = cm.query_start_loc[first:end + 1]
    qsl_cpu = cm.query_start_loc_cpu[first:end + 1]
    upper = cm.seq_lens_cpu_upper_bound
    return CommonAttentionMetadata(
        query_start_loc=qsl - qsl[:1], query_start_loc_cpu=qsl_cpu - qsl_cpu[:1],
        seq_lens=cm.seq_lens[first:end], num_reqs=end - first,
        num_actual_tokens=cm.num_actual_tokens - first_token,
        max_query_len=cm.max_query_len, max_seq_len=cm.max_seq_len,
        block_table_tensor=cm.block_table_tensor[first:end],
        slot_mapping=cm.slot_mapping[first_token:cm.num_actual_tokens],
        causal=cm.causal[first:end] if isinstance(cm.causal, torch.Tensor) else cm.causal,
        seq_lens_cpu_upper_bound=upper[first:end] if upper is not None else None)


def _is_set(value: Any) -> bool:
    """An extra impl argument that asks for a feature (``chunk_lookback=-1`` means off)."""
    if value is None or value is False:
        return False
    return not (isinstance(value, int) and value == -1)


class KDispatchAttentionImpl(AttentionImpl[KDispatchAttentionMetadata]):
    """Writes K/V with ``kdispatch.write_kv``; decodes with ``kdispatch.decode_attention``;
    hands the other tokens to vLLM's ``TritonAttentionImpl``."""

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: int | None = None, alibi_slopes: list[float] | None = None,
                 sliding_window: int | None = None, kv_cache_dtype: str = "auto",
                 logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, **unsupported: Any) -> None:
        num_kv_heads = num_kv_heads or num_heads
        # The same rules vLLM asked at selection, again here (model construction, before
        # any forward) for platforms that construct a backend without asking.
        reasons = limits.gqa_reasons(head_size, torch.get_default_dtype(), kv_cache_dtype)
        if alibi_slopes is not None:
            reasons.append("kdispatch: ALiBi slopes are not supported")
        if attn_type != AttentionType.DECODER:
            reasons.append(f"kdispatch: attention type {attn_type} is not supported "
                           "(decoder self-attention only)")
        extra = sorted(k for k, v in unsupported.items() if _is_set(v))
        if extra:
            reasons.append(f"kdispatch: {', '.join(extra)} not supported")
        if reasons:
            raise ValueError("; ".join(reasons))
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)
        self.prefill_impl = TritonAttentionImpl(
            num_heads, head_size, scale, num_kv_heads, None, sliding_window, kv_cache_dtype,
            logits_soft_cap, attn_type, kv_sharing_target_layer_name)

    def _caches(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_blocks, H, N, 2 * hs] (any physical layout) -> K, V views [num_blocks, N, H, hs]
        k_cache, v_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        return k_cache, v_cache

    def do_kv_cache_update(self, layer: AttentionLayer, key: torch.Tensor,
                           value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        k_cache, v_cache = self._caches(kv_cache)
        n = min(key.shape[0], slot_mapping.shape[0])
        kdispatch.write_kv(key[:n], value[:n], k_cache, v_cache, slot_mapping[:n])

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: KDispatchAttentionMetadata, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("kdispatch: fused output quantization is not supported")
        if attn_metadata is None:  # vLLM's profiling run
            return output.fill_(0)
        md = attn_metadata
        nd = md.num_decodes
        if nd:
            k_cache, v_cache = self._caches(kv_cache)
            kdispatch.decode_attention(
                query[:nd], k_cache, v_cache, md.block_table[:nd], md.seq_lens[:nd],
                scale=self.scale, out=output[:nd], sliding_window=self.sliding_window,
                logit_cap=self.logits_soft_cap, batch_invariant=self.batch_invariant,
                config=md.decode_config)
        if md.prefill is not None:
            start, end = md.num_decode_tokens, md.num_actual_tokens
            self.prefill_impl.forward(layer, query[start:end], key[start:end],
                                      value[start:end], kv_cache, md.prefill,
                                      output[start:end])
        return output


class KDispatchAttentionBackend(AttentionBackend):
    """kdispatch decode for GQA/MHA layers (vLLM's ``--attention-backend CUSTOM``)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = list(limits.KV_CACHE_DTYPES)
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return GQA_SLOT

    @staticmethod
    def get_impl_cls() -> type[KDispatchAttentionImpl]:
        return KDispatchAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[KDispatchAttentionMetadataBuilder]:
        return KDispatchAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        return list(limits.BLOCK_SIZES)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return not limits.gqa_reasons(head_size, torch.float16, None)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        return True

    @classmethod
    def validate_configuration(cls, head_size: int, dtype: torch.dtype,
                               kv_cache_dtype: Any, block_size: int | None, *args: Any,
                               **kwargs: Any) -> list[str]:
        """vLLM's reasons, with its generic head-size/dtype ones replaced by kdispatch's,
        which name the refused value and the fix."""
        reasons = super().validate_configuration(head_size, dtype, kv_cache_dtype,
                                                 block_size, *args, **kwargs)
        own = (limits.gqa_reasons(head_size, dtype, kv_cache_dtype)
               + limits.block_size_reasons(block_size))
        return own + [r for r in reasons if r not in SELECTION_GENERIC_REASONS]
