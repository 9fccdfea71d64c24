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
                     config: DecodeConfig | dict[str, Any] | None = None) -> torch.Tensor:
    """Split-KV paged decode attention (GQA/MHA and absorbed MLA).

    Parameters
    ----------
    q : Tensor ``[B, Hq, Dk]`` (bf16, fp16 or fp32; contiguous last dim)
    k_cache, v_cache : Tensor ``[num_blocks, page_size, Hk, D]`` in q's dtype
        For MLA (Hk == 1, Dk 576, Dv 512) pass ``v_cache = k_cache[..., :512]``: the view
        is detected and the latent is read once.
    block_table : int32 Tensor ``[B, max_pages]``
        A page id outside ``[0, num_blocks)`` is masked in the kernel: its tokens are
        never read and contribute nothing (a hostile table cannot read past the cache).
    seq_lens : int32 Tensor ``[B]`` (on the device; read only by the kernel)
        Clamped to ``[0, max_pages * page_size]``; a request of length 0 gets zeros.
    scale : float
        Softmax scale (finite).
    out : Tensor ``[B, Hq, Dv]``, optional
    sliding_window : int, optional
        Attend to the last ``sliding_window`` tokens only.
    logit_cap : float
        ``cap * tanh(s / cap)`` on the scores when > 0.
    batch_invariant : bool
        Make the split count independent of the batch size.
    config : DecodeConfig or mapping, optional
        Skip resolution and launch this config (it must be valid for the call's key).

    Returns
    -------
    Tensor ``[B, Hq, Dv]`` in q's dtype (``out`` when given).

    Notes
    -----
    ``NUM_KV_SPLITS`` and every other choice come from shapes, dtypes and the device, never
    from ``seq_lens`` values, so the call can be captured in a CUDA graph and replayed with
    new lengths. Under ``torch.compile`` it becomes the opaque
    ``torch.ops.kdispatch.decode_attention`` (or ``decode_attention_out`` with ``out``).

    Raises
    ------
    ValueError
        Naming the argument, for a malformed input or an invalid config.
    """
    if _compiling():
        cfg = config_json(config)
        if out is None:
            return torch.ops.kdispatch.decode_attention(
                q, k_cache, v_cache, block_table, seq_lens, scale, sliding_window, logit_cap,
                batch_invariant, cfg)
        torch.ops.kdispatch.decode_attention_out(
            q, k_cache, v_cache, block_table, seq_lens, scale, sliding_window, logit_cap,
            batch_invariant, cfg, out=out)
        return out
    return launch.decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, out,
                                   sliding_window, logit_cap, batch_invariant, config)
