"""The fp32 torch reference for ``decode_attention``: the op's correctness specification."""

from __future__ import annotations

import torch


def reference_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                               scale: float, sliding_window: int | None = None,
                               logit_cap: float = 0.0) -> torch.Tensor:
    """Paged decode attention computed in fp32 with plain torch ops, one request at a time.

    Parameters
    ----------
    q : Tensor ``[B, Hq, Dk]``
    k_cache : Tensor ``[num_blocks, page_size, Hk, Dk]``
    v_cache : Tensor ``[num_blocks, page_size, Hk, Dv]``
    block_table : int Tensor ``[B, max_pages]``
    seq_lens : int Tensor ``[B]`` (read on the host: this is a reference, not a kernel)
    scale : float
    sliding_window : int, optional
        Only the last ``sliding_window`` tokens of each request are attended to.
    logit_cap : float
        When > 0, scores become ``logit_cap * tanh(score / logit_cap)``.

    Returns
    -------
    Tensor ``[B, Hq, Dv]`` float32. A request of length 0 gives zeros.
    """
    b, hq, _ = q.shape
    page, hk = k_cache.shape[1], k_cache.shape[2]
    dv = v_cache.shape[3]
    group = hq // hk
    out = torch.zeros((b, hq, dv), dtype=torch.float32, device=q.device)
    lens = seq_lens.tolist()
    for i in range(b):
        n = min(int(lens[i]), block_table.shape[1] * page)  # the kernels' clamp
        if n <= 0:
            continue
        lo = max(0, n - sliding_window) if sliding_window is not None else 0
        pos = torch.arange(lo, n, device=q.device)
        pages = block_table[i].long()[pos // page]
        slots = pos % page
        k = k_cache[pages, slots].float()  # [L, Hk, Dk]
        v = v_cache[pages, slots].float()  # [L, Hk, Dv]
        qi = q[i].float().view(hk, group, -1)  # [Hk, G, Dk]
        s = torch.einsum("hgd,lhd->hgl", qi, k) * scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        p = torch.softmax(s, dim=-1)
        out[i] = torch.einsum("hgl,lhd->hgd", p, v).reshape(hq, dv)
    return out
