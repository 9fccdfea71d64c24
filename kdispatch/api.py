"""The public resolve/explain/stats calls and the dispatched op functions.

Each op function resolves its config on the host from the tensors' shapes, dtypes and
device (or takes ``config=``), then launches the kernel with that config. Serving code
imports these; it never imports the tuner.
"""

from __future__ import annotations

from typing import Any

from kdispatch import dispatcher as _dispatch
from kdispatch.dispatcher import Explanation, Stats, dispatcher
from kdispatch.registry import OpConfig, get_op


def resolve(op: str, /, config: Any = None, **args: Any) -> OpConfig:
    """The launch config for ``op`` at these shapes.

    Two call forms: tensor form (``q=..., k_cache=..., block_table=...``; only shapes,
    dtypes and devices are read) and plain form (``device="nvidia-h200", batch=8, ...``)
    for resolving a config on a machine without that GPU. ``config=`` (a config model or a
    mapping) is validated and returned as an override.

    >>> cfg = resolve("decode_attention", device="nvidia-h200", batch=8, context=327600,
    ...               num_q_heads=12, num_kv_heads=1, head_dim=576, head_dim_v=512,
    ...               page_size=16, dtype="bfloat16")
    >>> cfg.num_kv_splits > 1
    True
    """
    return (_dispatch._DISPATCHER or dispatcher()).resolve(op, args, config)


def explain(op: str, /, config: Any = None, **args: Any) -> Explanation:
    """Like :func:`resolve`, but returns the key, the config, the provenance
    (``memo``, ``database``, ``table``, ``heuristic`` or ``override``) and every source
    consulted."""
    return dispatcher().explain(op, args, config)


def stats() -> Stats:
    """Resolution counters of this process: by source, memo hits, and heuristic misses."""
    return dispatcher().stats()


def write_kv(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, *,
             row_mask: Any = None, active_rows: Any = None, config: Any = None) -> None:
    """Scatter new K/V rows into a paged cache (the ``kv_write`` op).

    Parameters
    ----------
    key, value : Tensor ``[T, H, D]``
        Any strides with a contiguous last dim (e.g. views into one qkv projection).
    key_cache, value_cache : Tensor ``[num_blocks, page_size, H, D]``
        Same dtype as ``key``; K and V caches may have different strides.
    slot_mapping : int32/int64 Tensor ``[T]``
        ``block * page_size + offset``; a negative slot skips the row.
    row_mask : bool Tensor ``[T]``, optional
        Rows with False are not written (read on device at run/replay time).
    active_rows : int32 Tensor ``[1]``, optional
        Only rows ``< active_rows[0]`` write (read on device at run/replay time).
    config : KVWriteConfig or mapping, optional
        Skip resolution and launch this config.
    """
    d = dispatcher()
    args = {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
            "slot_mapping": slot_mapping, "row_mask": row_mask, "active_rows": active_rows}
    cfg = d.resolve("kv_write", args, config)
    get_op("kv_write").launch(cfg, **args)


def decode_attention(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, *,
                     scale: float, out: Any = None, sliding_window: int | None = None,
                     logit_cap: float = 0.0, batch_invariant: bool = False,
                     config: Any = None) -> Any:
    """Split-KV paged decode attention (GQA/MHA and absorbed MLA).

    Parameters
    ----------
    q : Tensor ``[B, Hq, Dk]`` (bf16, fp16 or fp32)
    k_cache, v_cache : Tensor ``[num_blocks, page_size, Hk, D]``
        For MLA (Hk == 1, Dk 576, Dv 512) ``v_cache`` is the view ``k_cache[..., :512]``.
    block_table : int32 Tensor ``[B, max_pages]``
    seq_lens : int32 Tensor ``[B]`` (on the device; read only by the kernel)
    scale : float
        Softmax scale.
    out : Tensor ``[B, Hq, Dv]``, optional
    sliding_window : int, optional
        Attend to the last ``sliding_window`` tokens only.
    logit_cap : float
        ``cap * tanh(s / cap)`` on the scores when > 0.
    batch_invariant : bool
        Make the split count independent of the batch size.
    config : DecodeConfig or mapping, optional

    Returns
    -------
    Tensor ``[B, Hq, Dv]`` in q's dtype.
    """
    d = dispatcher()
    args = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
            "seq_lens": seq_lens, "sliding_window": sliding_window,
            "batch_invariant": batch_invariant}
    cfg = d.resolve("decode_attention", args, config)
    return get_op("decode_attention").launch(
        cfg, q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
        seq_lens=seq_lens, scale=scale, out=out, sliding_window=sliding_window,
        logit_cap=logit_cap)
