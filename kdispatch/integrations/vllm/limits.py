"""What the kdispatch vLLM backends accept, as plain rules (no vLLM, no device).

vLLM asks a backend at selection time whether it can serve a layer (head size, model dtype,
KV-cache dtype). These rules answer with messages that name the refused value and say what
to change, so a user learns it from ``--attention-backend ...`` failing at start-up, never
from the first forward. They restate the documented limits of kdispatch's public ops
(``decode_attention``: q/k head dim up to 576, v head dim up to 512 and at most 256 extra
q/k columns; q and caches in float16, bfloat16 or float32) rather than importing the
kernels' private checks.
"""

from __future__ import annotations

from typing import Any

#: dtypes the decode kernel and the cache writer take for q and for the caches
DTYPES = ("float16", "bfloat16", "float32")
#: vLLM ``--kv-cache-dtype`` values that store the model dtype (no quantization)
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32")
MAX_HEAD_DIM = 576
MAX_HEAD_DIM_V = 512
MAX_EXTRA_QK_COLUMNS = 256
#: vLLM's Triton attention, which runs the prefill tokens of the GQA/MHA backend, takes
#: head sizes from 32 on (TritonAttentionBackend.supports_head_size).
MIN_HEAD_DIM_PREFILL = 32
#: vLLM's MLA layers use these latent head sizes (MLACommonBackend.get_supported_head_sizes)
MLA_HEAD_SIZES = (320, 512, 576)
#: page sizes both kdispatch (powers of two) and vLLM's Triton kernels (multiples of 16) take
BLOCK_SIZES = (16, 32, 64, 128, 256)

_FIX_DTYPE = "run the model in float16, bfloat16 or float32 (--dtype)"
_FIX_KV = ("store the KV cache in the model dtype (--kv-cache-dtype auto), or pick another "
           "--attention-backend")


def dtype_name(dtype: Any) -> str:
    """``"float16"`` for ``torch.float16`` or ``"float16"``; other values as ``str()`` gives."""
    text = str(dtype)
    return text[len("torch."):] if text.startswith("torch.") else text


def dtype_reasons(dtype: Any, kv_cache_dtype: str | None) -> list[str]:
    """Why kdispatch cannot run a layer of this model dtype and KV-cache dtype (or [])."""
    reasons = []
    name = dtype_name(dtype)
    if name not in DTYPES:
        reasons.append(f"kdispatch: model dtype {name} is not supported (float16, bfloat16 or "
                       f"float32 only); {_FIX_DTYPE}")
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
        what = ("fp8 KV caches are not supported yet" if "fp8" in kv_cache_dtype
                else "quantized KV caches are not supported")
        reasons.append(f"kdispatch: kv-cache dtype {kv_cache_dtype!r} is refused: {what}; "
                       f"{_FIX_KV}")
    return reasons


def head_dim_reasons(head_dim: int, head_dim_v: int) -> list[str]:
    """Why ``decode_attention`` cannot take these q/k and v head dims (or [])."""
    reasons = []
    if head_dim < 1 or head_dim_v < 1 or head_dim_v > head_dim:
        reasons.append(f"kdispatch: head dims q/k {head_dim}, v {head_dim_v} are not "
                       "supported (need 1 <= v head dim <= q/k head dim)")
        return reasons
    if head_dim > MAX_HEAD_DIM:
        reasons.append(f"kdispatch: head size {head_dim} is not supported (q/k head dim at "
                       f"most {MAX_HEAD_DIM})")
    if head_dim_v > MAX_HEAD_DIM_V:
        reasons.append(f"kdispatch: v head size {head_dim_v} is not supported (at most "
                       f"{MAX_HEAD_DIM_V})")
    if head_dim - head_dim_v > MAX_EXTRA_QK_COLUMNS:
        reasons.append(f"kdispatch: head sizes q/k {head_dim}, v {head_dim_v} are not "
                       f"supported (at most {MAX_EXTRA_QK_COLUMNS} more q/k than v columns)")
    return reasons


def gqa_reasons(head_size: int, dtype: Any, kv_cache_dtype: str | None) -> list[str]:
    """Why the GQA/MHA backend cannot serve a layer (or []): K and V share ``head_size``,
    and prefill tokens run in vLLM's Triton attention, which needs ``head_size >= 32``."""
    reasons = head_dim_reasons(head_size, head_size)
    if not reasons and head_size < MIN_HEAD_DIM_PREFILL:
        reasons.append(f"kdispatch: head size {head_size} is not supported (at least "
                       f"{MIN_HEAD_DIM_PREFILL}: prefill tokens run in vLLM's Triton "
                       "attention)")
    return reasons + dtype_reasons(dtype, kv_cache_dtype)


def mla_reasons(head_size: int, dtype: Any, kv_cache_dtype: str | None,
                kv_lora_rank: int | None = None) -> list[str]:
    """Why the MLA backend cannot serve a layer (or []). ``head_size`` is the latent row
    (kv_lora_rank + rope dim, 576 for DeepSeek V2/V3); the decode reads V as the first
    ``kv_lora_rank`` columns. Without ``kv_lora_rank`` (vLLM's selection-time question) only
    the row width is checked."""
    if kv_lora_rank is None:
        reasons = head_dim_reasons(head_size, min(head_size, MAX_HEAD_DIM_V))
        if not reasons and head_size not in MLA_HEAD_SIZES:
            reasons.append(f"kdispatch: MLA head size {head_size} is not one of vLLM's MLA "
                           f"latent sizes {MLA_HEAD_SIZES}")
    else:
        reasons = head_dim_reasons(head_size, kv_lora_rank)
    return reasons + dtype_reasons(dtype, kv_cache_dtype)


def block_size_reasons(block_size: int | None) -> list[str]:
    """Why a KV-cache block size cannot be split into kdispatch pages (or [])."""
    if block_size is None or block_size % BLOCK_SIZES[0] == 0:
        return []
    return [f"kdispatch: block size {block_size} is not supported (a multiple of "
            f"{BLOCK_SIZES[0]}: pages of {', '.join(map(str, BLOCK_SIZES))} tokens)"]
