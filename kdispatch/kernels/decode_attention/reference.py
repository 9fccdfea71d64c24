"""The fp32 torch reference for ``decode_attention``: the op's correctness specification."""

from __future__ import annotations

import torch


def reference_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                               scale: float, sliding_window: int | None = None,
                               logit_cap: float = 0.0, k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Paged decode attention computed in fp32 with plain torch ops, one request at a time.

    Parameters
    ----------
    q : Tensor ``[B, Hq, Dk]``, or ``[B, Q, Hq, Dk]`` for ``Q`` new tokens per request
    k_cache : Tensor ``[num_blocks, page_size, Hk, Dk]`` (float, or fp8 with scales)
    v_cache : Tensor ``[num_blocks, page_size, Hk, Dv]``
    block_table : int Tensor ``[B, max_pages]``
    seq_lens : int Tensor ``[B]`` (read on the host: this is a reference, not a kernel)
        Cached tokens per request, the new tokens' own K/V included: new token ``i`` of
        ``Q`` sees the first ``seq_len - Q + 1 + i`` (causal among the new tokens).
    scale : float
    sliding_window : int, optional
        Each token sees only the last ``sliding_window`` of the tokens it may see.
    logit_cap : float
        When > 0, scores become ``logit_cap * tanh(score / logit_cap)``.
    k_scale, v_scale : one-element float32 Tensor, optional
        The cache is dequantized as ``stored.float() * scale`` before anything else.

    Returns
    -------
    Tensor float32, ``[B, Hq, Dv]`` (or ``[B, Q, Hq, Dv]``). A token that sees no cached
    token gets zeros.
    """
    q4 = q if q.dim() == 4 else q.unsqueeze(1)
    b, q_len, hq, _ = q4.shape
    page, hk = k_cache.shape[1], k_cache.shape[2]
    dv = v_cache.shape[3]
    group = hq // hk
    ks = 1.0 if k_scale is None else k_scale.float().reshape(())
    vs = 1.0 if v_scale is None else v_scale.float().reshape(())
    out = torch.zeros((b, q_len, hq, dv), dtype=torch.float32, device=q.device)
    lens = seq_lens.tolist()
    cap = block_table.shape[1] * page
    for i in range(b):
        length = min(max(int(lens[i]), 0), cap)  # the kernels' clamp
        for t in range(q_len):
            n = length - q_len + 1 + t
            if n <= 0:
                continue
            lo = max(0, n - sliding_window) if sliding_window is not None else 0
            pos = torch.arange(lo, n, device=q.device)
            pages = block_table[i].long()[pos // page]
            slots = pos % page
            k = k_cache[pages, slots].float() * ks  # [L, Hk, Dk]
            v = v_cache[pages, slots].float() * vs  # [L, Hk, Dv]
            qi = q4[i, t].float().view(hk, group, -1)  # [Hk, G, Dk]
            s = torch.einsum("hgd,lhd->hgl", qi, k) * scale
            if logit_cap > 0:
                s = logit_cap * torch.tanh(s / logit_cap)
            p = torch.softmax(s, dim=-1)
            out[i, t] = torch.einsum("hgl,lhd->hgd", p, v).reshape(hq, dv)
    return out if q.dim() == 4 else out[:, 0]
