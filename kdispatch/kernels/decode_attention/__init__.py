"""Split-KV paged decode attention for GQA/MHA and absorbed MLA (op ``decode_attention``).

Layout: ``q [B, Hq, Dk]`` or ``[B, Q, Hq, Dk]`` (Q new tokens per request, causal among
them), caches ``[num_blocks, page_size, Hk, D]`` (vLLM flash layout, any strides with a
contiguous last dim; q's dtype, or fp8 with per-tensor ``k_scale``/``v_scale`` tensors
read by the kernel), ``block_table int32 [B, max_pages]``, ``seq_lens int32 [B]`` (read
only on the device). Absorbed MLA passes one latent cache of head dim 576 as ``k_cache``
and its view ``k_cache[..., :512]`` as ``v_cache``.

Modules: ``kernels`` (the generic stage 1, the reduce, shared helpers), ``latent`` (the
shared-latent stage 1), ``launch`` (plan, launcher, cached path),
``checks``, ``spec`` (key, config, heuristic, validity), ``tuning``, ``reference``,
``torch_op``, ``api`` (the public function), ``op`` (the op declared here as ``OP``).
"""

from kdispatch.kernels.decode_attention.api import decode_attention
from kdispatch.kernels.decode_attention.checks import check_decode_inputs, shares_latent
from kdispatch.kernels.decode_attention.launch import launch_decode_attention
from kdispatch.kernels.decode_attention.op import OP
from kdispatch.kernels.decode_attention.reference import reference_decode_attention
from kdispatch.kernels.decode_attention.spec import DecodeConfig, DecodeKey

__all__ = ["OP", "DecodeConfig", "DecodeKey", "check_decode_inputs", "decode_attention",
           "launch_decode_attention", "reference_decode_attention", "shares_latent"]
