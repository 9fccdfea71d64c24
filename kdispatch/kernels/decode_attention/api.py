"""The public ``kdispatch.decode_attention``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kdispatch.kernels.decode_attention import launch
from kdispatch.kernels.decode_attention import torch_op as _torch_op  # noqa: F401 - registers
from kdispatch.torch_library import config_json

if TYPE_CHECKING:
    from kdispatch.kernels.decode_attention.spec import DecodeConfig

_compiling = torch.compiler.is_compiling


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
                     out: torch.Tensor | None = None, sliding_window: int | None = None,
                     logit_cap: float = 0.0, batch_invariant: bool = False,
                     config: DecodeConfig | dict[str, Any] | None = None,
                     k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Split-KV paged decode attention (GQA/MHA and absorbed MLA), one or more new tokens.

    Parameters
    ----------
    q : Tensor ``[B, Hq, Dk]``, or ``[B, Q, Hq, Dk]`` with ``Q`` in 1..8 new tokens per
        request (speculative decoding, multi-token prediction); bf16, fp16 or fp32;
        contiguous last dim. New token ``i`` attends to the first ``seq_len - Q + 1 + i``
        cached tokens (causal among the new tokens, whose K/V are already written).
    k_cache, v_cache : Tensor ``[num_blocks, page_size, Hk, D]``
        In q's dtype, or both ``torch.float8_e4m3fn`` (``float8_e4m3fnuz`` on AMD GPUs
        that use it): loaded as fp8 and dequantized in the kernel. For MLA (Hk == 1,
        Dk 576, Dv 512) pass ``v_cache = k_cache[..., :512]``: the view is detected and
        the latent is read once (in fp8 too).
    block_table : int32 Tensor ``[B, max_pages]``
        A page id outside ``[0, num_blocks)`` is masked in the kernel: its tokens are
        never read and contribute nothing (a hostile table cannot read past the cache).
    seq_lens : int32 Tensor ``[B]`` (on the device; read only by the kernel)
        Cached tokens per request, the new tokens included; clamped to
        ``[0, max_pages * page_size]``. A token that sees no cached token gets zeros.
    scale : float
        Softmax scale (finite).
    out : Tensor ``[B, Hq, Dv]`` (``[B, Q, Hq, Dv]`` for a 4-D q), optional
    sliding_window : int, optional
        Attend to the last ``sliding_window`` tokens only.
    logit_cap : float
        ``cap * tanh(s / cap)`` on the scores when > 0.
    batch_invariant : bool
        Make every request's result independent of its batch: the split count is that of
        a batch of one, and each request cuts its own length into it. Off (the default),
        a batch of ragged lengths runs on a balanced split grid: requests longer than the
        batch's mean get more programs, so every program holds about the same work (on
        the H200 0.68-0.89x the time of per-request splits at lengths spread around half
        the table's width), and a request's bits may depend on the other lengths.
    config : DecodeConfig or mapping, optional
        Skip resolution and launch this config (it must be valid for the call's key).
    k_scale, v_scale : float32 Tensor ``[1]`` or ``[]``, optional
        Per-tensor dequantization scales of an fp8 cache (both or neither; 1.0 when not
        given): the cache holds ``value / scale`` (:func:`kdispatch.write_kv`). On the
        cache's device and read by the kernel, so a captured graph replays correctly after
        the scales change. Given with a non-fp8 cache they are an error.

    Returns
    -------
    Tensor ``[B, Hq, Dv]`` (``[B, Q, Hq, Dv]``) in q's dtype (``out`` when given).

    Notes
    -----
    ``NUM_KV_SPLITS`` and every other choice come from shapes, dtypes and the device, never
    from ``seq_lens`` values, so the call can be captured in a CUDA graph and replayed with
    new lengths. Under ``torch.compile`` it becomes the opaque
    ``torch.ops.kdispatch.decode_attention`` (or ``decode_attention_out`` with ``out``).

    Accuracy with an fp8 cache: against the fp32 reference on the dequantized cache,
    within q's dtype's tolerance (bf16: 2e-2; the dots run in fp16, exact for fp8 values).
    Against the same attention on the unquantized bf16 values the error is the cache's own
    quantization error. Measured with per-tensor scales ``amax / 448`` on unit-variance
    random q/K/V (GQA D 128 at 1-256 tokens, MLA 576/512; ``tests/kernels/
    test_decode_fp8.py``): relative error of the whole output 2.9-4.6%, element-wise at
    most 5.7% of ``max|V|`` (a one-token request returns a V row off by its rounding, up
    to 2^-4 relative); the tests hold it to 6% and 7.5%.

    Raises
    ------
    ValueError
        Naming the argument, for a malformed input or an invalid config.
    """
    if _compiling():
        ops = torch.ops.kdispatch
        if (sliding_window is None and not logit_cap and not batch_invariant
                and config is None and k_scale is None and v_scale is None):
            if out is None:  # the six-argument default overloads
                return ops.decode_attention.default(q, k_cache, v_cache, block_table,
                                                    seq_lens, scale)
            ops.decode_attention_out.default(q, k_cache, v_cache, block_table, seq_lens,
                                             scale, out=out)
            return out
        cfg = config_json(config)
        if out is None:
            return ops.decode_attention.full(
                q, k_cache, v_cache, block_table, seq_lens, scale, sliding_window, logit_cap,
                batch_invariant, cfg, k_scale, v_scale)
        ops.decode_attention_out.full(
            q, k_cache, v_cache, block_table, seq_lens, scale, sliding_window, logit_cap,
            batch_invariant, cfg, k_scale, v_scale, out=out)
        return out
    return launch.decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, out,
                                   sliding_window, logit_cap, batch_invariant, config,
                                   k_scale, v_scale)
