"""The ``kv_write`` op: paged KV-cache writes (serving face; tuning face in ``tuning``)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import torch

from kdispatch.buckets import pow2_bucket
from kdispatch.dtypes import CACHE_DTYPES, dtype_name
from kdispatch.kernels.kv_write import spec
from kdispatch.kernels.kv_write.kernel import _kv_write_kernel
from kdispatch.kernels.kv_write.launch import launch_kv_write, launches
from kdispatch.kernels.kv_write.tuning import KVWriteTuning
from kdispatch.opdef import Op, OpKey


def _masking(has_mask: bool, has_active: bool) -> spec.Masking:
    if has_mask and has_active:
        return "both"
    return "row_mask" if has_mask else ("active_rows" if has_active else "none")


def _tensor_arg(args: Mapping[str, Any], name: str) -> torch.Tensor:
    t = args.get(name)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


#: the tensor form's names: a write call's arguments (the key reads key, key_cache and
#: whether a mask is given; the memo key also holds the names, so a hit never serves a
#: call that names one the key refuses)
TENSOR_ARGS = frozenset({"key", "value", "key_cache", "value_cache", "slot_mapping",
                         "row_mask", "active_rows", "k_scale", "v_scale"})


class KVWriteOp(Op):
    """Scatter new K/V rows into a paged cache (see :func:`kdispatch.write_kv`)."""

    name = "kv_write"
    key_model = spec.KVWriteKey
    config_model = spec.KVWriteConfig
    args_model = spec.KVWriteArgs
    kernels = (_kv_write_kernel,)
    launch_code = (launches,)
    table_dirs: tuple[str | Path, ...] = ()
    tuning = KVWriteTuning()
    tensor_args = TENSOR_ARGS

    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        key = args.get("key")
        if key is not None:
            try:
                cache = args["key_cache"]
                return (tuple(args), key.shape, key.dtype, key.device, cache.shape[1],
                        cache.dtype, args.get("row_mask") is not None,
                        args.get("active_rows") is not None)
            except (AttributeError, KeyError, IndexError, TypeError):
                return ("invalid", id(args))  # not tensors: key() names the argument
        return tuple(args.items())

    def device_of(self, args: Mapping[str, Any]) -> Any:
        if args.get("key") is not None:
            return _tensor_arg(args, "key").device
        return args.get("device")

    def key(self, device: Any, args: Mapping[str, Any]) -> spec.KVWriteKey:
        fields = OpKey.device_fields(device)
        if args.get("key") is not None:
            key = _tensor_arg(args, "key")
            cache = _tensor_arg(args, "key_cache")
            if key.dim() != 3:
                raise ValueError(f"key: expected [T, H, D], got shape {tuple(key.shape)}")
            if cache.dim() != 4:
                raise ValueError(f"key_cache: expected a 4-D [num_blocks, page_size, heads, "
                                 f"dim] cache, got shape {tuple(cache.shape)}")
            num_tokens, num_heads, head_dim = key.shape
            return spec.KVWriteKey(
                **fields, dtype=dtype_name(key.dtype, "key"),
                kv_dtype=dtype_name(cache.dtype, "key_cache", CACHE_DTYPES),
                num_kv_heads=num_heads,
                head_dim=head_dim, page_size=cache.shape[1],
                tokens=pow2_bucket(max(int(num_tokens), 1), 1, spec.MAX_TOKENS_BUCKET),
                masking=_masking(args.get("row_mask") is not None,
                                 args.get("active_rows") is not None))
        args = self.plain_args(args)
        return spec.KVWriteKey(
            **fields, dtype=args["dtype"], kv_dtype=args["kv_dtype"] or args["dtype"],
            num_kv_heads=args["num_kv_heads"],
            head_dim=args["head_dim"], page_size=args["page_size"],
            tokens=pow2_bucket(args["tokens"], 1, spec.MAX_TOKENS_BUCKET),
            masking=args["masking"])

    def heuristic(self, key: Any) -> spec.KVWriteConfig:
        return spec.heuristic(key)

    def is_valid(self, key: Any, config: Any) -> bool:
        return spec.is_valid(key, config)

    def servable(self, key: Any, config: Any) -> bool:
        # the indexed baseline writes a negative slot into the cache's last slot and raises
        # on slots past the end: only an explicit config= may launch it
        return config.variant == "fused" and spec.is_valid(key, config)

    def launch(self, config: Any, **call_args: Any) -> None:
        return launch_kv_write(config, **call_args)


OP = KVWriteOp()
