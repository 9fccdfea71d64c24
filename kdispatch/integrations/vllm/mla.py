"""The absorbed-MLA backend (DeepSeek V2/V3-style models): kdispatch decode on the latent
cache, vLLM's MLA prefill for the rest.

vLLM's MLA layer absorbs ``W_UK`` into the decode query and calls ``forward_mqa`` with
``q = [B, num_heads, kv_lora_rank + rope]`` over the latent cache
``[num_blocks, block_size, kv_lora_rank + rope]``; ``forward_mqa`` returns the latent output
``[B, num_heads, kv_lora_rank]`` that the layer projects with ``W_UV``. Here that decode is
``kdispatch.decode_attention`` with ``v_cache = k_cache[..., :kv_lora_rank]`` of the one
latent cache (the kernel reads each latent row once), with a config resolved in the metadata
builder from the block-table width x page size.

Only single-token decodes take this path (``QueryLenSupport.SINGLE_ONLY``): vLLM routes
prefill, chunked prefill and multi-token (speculative) queries to its MLA prefill backend
(``forward_mha``, chosen by vLLM for the platform). The latent KV write is one
``kdispatch.write_kv`` of the concatenated ``[kv_c | k_pe]`` rows. No lse is returned, so
decode context parallelism (DCP) is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kdispatch.integrations.vllm import MLA_NAME, limits, require_vllm

require_vllm()

import torch  # noqa: E402
from vllm import envs  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import (  # noqa: E402
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.v1.attention.backend import (  # noqa: E402
    AttentionCGSupport,
    AttentionLayer,
    AttentionType,
)

import kdispatch  # noqa: E402
from kdispatch.integrations.vllm.common import (  # noqa: E402
    SELECTION_GENERIC_REASONS,
    resolve_decode_config,
)


@dataclass
class KDispatchMLADecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's decode metadata plus the kdispatch config resolved for it."""

    config: Any = None


class KDispatchMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    """vLLM's MLA builder; the decode part also carries the kdispatch config."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.SINGLE_ONLY

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.kd_device = kdispatch.Device.from_torch(device)
        self.batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)

    def _build_decode(self, block_table_tensor: torch.Tensor, seq_lens_device: torch.Tensor,
                      max_seq_len: int, query_start_loc_cpu: torch.Tensor,
                      query_start_loc_device: torch.Tensor, num_decode_tokens: int,
                      max_query_len: int, dcp_tot_seq_lens_device: torch.Tensor | None
                      ) -> KDispatchMLADecodeMetadata:
        dims = self.mla_dims
        latent = dims.kv_lora_rank + dims.qk_rope_head_dim
        config = resolve_decode_config(
            self.kd_device, batch=block_table_tensor.shape[0],
            context=block_table_tensor.shape[1] * self.page_size, num_q_heads=self.num_heads,
            num_kv_heads=1, head_dim=latent, head_dim_v=dims.kv_lora_rank,
            page_size=self.page_size, dtype=self.model_config.dtype,
            kv_dtype=self.kv_cache_spec.dtype, batch_invariant=self.batch_invariant)
        return KDispatchMLADecodeMetadata(block_table=block_table_tensor,
                                          seq_lens=seq_lens_device,
                                          dcp_tot_seq_lens=dcp_tot_seq_lens_device,
                                          config=config)


class KDispatchMLAImpl(MLACommonImpl[MLACommonMetadata]):
    """``forward_mqa`` through ``kdispatch.decode_attention``; latent writes through
    ``kdispatch.write_kv``."""

    can_return_lse_for_decode: bool = False
    supports_dcp: bool = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None,
                 kv_cache_dtype: str, logits_soft_cap: float | None, attn_type: str,
                 kv_sharing_target_layer_name: str | None, **mla_args: Any) -> None:
        reasons = limits.mla_reasons(head_size, torch.get_default_dtype(), kv_cache_dtype,
                                     kv_lora_rank=mla_args.get("kv_lora_rank"))
        for name, value in (("ALiBi slopes", alibi_slopes), ("sliding window", sliding_window),
                            ("logits soft cap", logits_soft_cap),
                            ("a sparse indexer", mla_args.get("indexer"))):
            if value:
                reasons.append(f"kdispatch: MLA with {name} is not supported")
        if attn_type != AttentionType.DECODER:
            reasons.append(f"kdispatch: attention type {attn_type} is not supported")
        if head_size % 2:
            reasons.append(f"kdispatch: MLA latent width {head_size} must be even")
        if reasons:
            raise ValueError("; ".join(reasons))
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes,
                         sliding_window, kv_cache_dtype, logits_soft_cap, attn_type,
                         kv_sharing_target_layer_name, **mla_args)
        self.supports_quant_query_input = False  # q stays in the model dtype
        self.batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        """Write ``[kv_c | k_pe]`` rows at ``slot_mapping`` (negative slots are skipped).

        The row is written as two equal halves, the "K" and "V" operands of one fused
        ``write_kv`` launch, into the two halves of the latent cache row.
        """
        if kv_cache.numel() == 0:
            return
        n = min(kv_c_normed.shape[0], slot_mapping.shape[0])
        rows = torch.cat([kv_c_normed[:n], k_pe[:n].reshape(n, -1)], dim=-1)[:, None, :]
        half = rows.shape[-1] // 2
        cache = kv_cache.unsqueeze(2)  # [num_blocks, block_size, 1, latent]
        kdispatch.write_kv(rows[..., :half], rows[..., half:], cache[..., :half],
                           cache[..., half:], slot_mapping[:n])

    def forward_mqa(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                    kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: MLACommonMetadata,
                    layer: AttentionLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        decode = attn_metadata.decode
        if decode is None:
            raise ValueError("kdispatch: forward_mqa called without decode metadata")
        cache = kv_c_and_k_pe_cache.unsqueeze(2)  # [num_blocks, block_size, 1, latent]
        out = kdispatch.decode_attention(
            q, cache, cache[..., :self.kv_lora_rank], decode.block_table, decode.seq_lens,
            scale=self.scale, batch_invariant=self.batch_invariant,
            config=getattr(decode, "config", None))
        return out, None


class KDispatchMLABackend(MLACommonBackend):
    """kdispatch decode for MLA layers (vLLM's ``--attention-backend KDISPATCH_MLA``)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16,
                                                     torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = list(limits.KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return MLA_NAME

    @staticmethod
    def get_impl_cls() -> type[KDispatchMLAImpl]:
        return KDispatchMLAImpl

    @staticmethod
    def get_builder_cls() -> type[KDispatchMLAMetadataBuilder]:
        return KDispatchMLAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        return list(limits.BLOCK_SIZES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(limits.MLA_HEAD_SIZES)

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        return True

    @classmethod
    def validate_configuration(cls, head_size: int, dtype: torch.dtype,
                               kv_cache_dtype: Any, block_size: int | None, *args: Any,
                               **kwargs: Any) -> list[str]:
        """vLLM's reasons, with its generic head-size/dtype ones replaced by kdispatch's."""
        reasons = super().validate_configuration(head_size, dtype, kv_cache_dtype,
                                                 block_size, *args, **kwargs)
        own = (limits.mla_reasons(head_size, dtype, kv_cache_dtype)
               + limits.block_size_reasons(block_size))
        return own + [r for r in reasons if r not in SELECTION_GENERIC_REASONS]
