"""Dispatch spec of ``kv_write``: memo key, key building, heuristic, candidates, pruning,
and the tuner's hooks.

Kept apart from the kernel module: the kernel module's source is what a tuned row's
source hash covers, so heuristic or key-building changes here never stale a tuned table.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import torch
import triton

from kdispatch.buckets import pow2_bucket
from kdispatch.device import Device
from kdispatch.kernels._common import TORCH_DTYPES, dtype_name, pdl_capable
from kdispatch.kernels.kv_write import (BLOCK_H_MAX, MAX_ELEMS_PER_THREAD, MAX_TILE,
                                        MAX_TOKENS_BUCKET, KVWriteConfig, KVWriteKey, Masking,
                                        launch_kv_write, reference_kv_write)
from kdispatch.registry import NUM_WARPS, OpConfig, OpKey, OpSpec, ladder

# Tile elements per operand (heads x padded head dim) a fused program copies, by token
# bucket. H200, 16x128 bf16, 96 graph-replayed writes (bench/results/nvidia-h200/
# kv_write.json sweep): T=1 best at 512 (4 heads: 1.110 us/write vs 1.230 at 2048);
# T=64 best at 2048 (16 heads: 2.156 vs 2.210 at 512); T=16384 within 1% for 1024-2048.
_TILE_BY_TOKENS: tuple[tuple[int, int], ...] = ((1, 512), (MAX_TOKENS_BUCKET, 2048))
# Warps by tile elements per operand. Same sweep: 512-element tile best at 4 warps (1.110 vs
# 1.143 us at 2, 1.151 at 1); 2048 best at 4 for T=64 (2.156 vs 2.231 at 2), and 8 vs 4
# within 0.5% for the 16384-token write. Small tiles: no more warps than 16 B vectors.
_WARPS_BY_TILE: tuple[tuple[int, int], ...] = ((128, 1), (256, 2), (2048, 4), (MAX_TILE, 8))
# Rows per program: 1. Same sweep: 2 or 4 rows never beat 1 (T=64: 2.160 vs 2.156 us;
# T=16384: 70.24 vs 69.46 us at 8 heads, 8 warps).
_BLOCK_T = 1


def _tensor_arg(args: Mapping[str, Any], name: str) -> torch.Tensor:
    t = args.get(name)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _masking(has_mask: bool, has_active: bool) -> Masking:
    if has_mask and has_active:
        return "both"
    return "row_mask" if has_mask else ("active_rows" if has_active else "none")


def _is_tensor_form(args: Mapping[str, Any]) -> bool:
    return args.get("key") is not None


class KVWriteSpec(OpSpec):
    """The ``kv_write`` op: see the module docstring."""

    name = "kv_write"
    key_model = KVWriteKey
    config_model = KVWriteConfig
    source_modules = ("kdispatch.kernels.kv_write",)

    _PLAIN = ("tokens", "num_kv_heads", "head_dim", "page_size", "dtype")

    # -- resolution ----------------------------------------------------------------------------
    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        """Exactly what :meth:`key` reads; attribute reads only (the resolve hot path)."""
        key = args.get("key")
        if key is not None:
            try:
                return (key.shape, key.dtype, key.device, args["key_cache"].shape[1],
                        args.get("row_mask") is not None, args.get("active_rows") is not None)
            except (AttributeError, KeyError, IndexError, TypeError):
                return ("invalid", id(args))  # not tensors: key() names the argument
        # every plain argument as given (a different order is merely another memo entry)
        return tuple(args.items())

    def key(self, device: Device, args: Mapping[str, Any]) -> KVWriteKey:
        fields = OpKey.device_fields(device)
        if _is_tensor_form(args):
            key = _tensor_arg(args, "key")
            cache = _tensor_arg(args, "key_cache")
            if key.dim() != 3:
                raise ValueError(f"key: expected [T, H, D], got shape {tuple(key.shape)}")
            if cache.dim() != 4:
                raise ValueError(f"key_cache: expected a 4-D [num_blocks, page_size, heads, "
                                 f"dim] cache, got shape {tuple(cache.shape)}")
            num_tokens, num_heads, head_dim = key.shape
            return KVWriteKey(
                **fields, dtype=dtype_name(key.dtype, "key"), num_kv_heads=num_heads,
                head_dim=head_dim, page_size=cache.shape[1],
                tokens=pow2_bucket(max(int(num_tokens), 1), 1, MAX_TOKENS_BUCKET),
                masking=_masking(args.get("row_mask") is not None,
                                 args.get("active_rows") is not None))
        missing = [n for n in self._PLAIN if args.get(n) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required for a plain-form kv_write key "
                             f"(or pass the key/key_cache tensors)")
        tokens = int(args["tokens"])
        if tokens < 1:
            raise ValueError(f"tokens: must be >= 1, got {tokens}")
        return KVWriteKey(
            **fields, dtype=dtype_name(args["dtype"]), num_kv_heads=args["num_kv_heads"],
            head_dim=args["head_dim"], page_size=args["page_size"],
            tokens=pow2_bucket(tokens, 1, MAX_TOKENS_BUCKET),
            masking=args.get("masking", "none"))

    def device_of(self, args: Mapping[str, Any]) -> Device | str | None:
        if _is_tensor_form(args):
            return _tensor_arg(args, "key").device
        return args.get("device")

    def heuristic(self, key: KVWriteKey) -> KVWriteConfig:  # type: ignore[override]
        block_d = triton.next_power_of_2(key.head_dim)
        per_row = max(1, min(BLOCK_H_MAX, ladder(_TILE_BY_TOKENS, key.tokens) // block_d))
        block_h = min(per_row, triton.next_power_of_2(key.num_kv_heads))
        block_t = _BLOCK_T
        tile = block_t * block_h * block_d
        # pdl: back-to-back writes (one per layer) overlap their launch latency
        return KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                             num_warps=ladder(_WARPS_BY_TILE, tile), pdl=pdl_capable(key))

    def candidates(self, key: KVWriteKey) -> Iterable[KVWriteConfig]:  # type: ignore[override]
        # with pdl available every tile is tried with it, and the heuristic's tile without
        # (first, so a capped sweep keeps the comparison)
        pdl = pdl_capable(key)
        out = []
        for block_h in (1, 2, 4, 8, 16, 32, 64):
            for block_t in (1, 2, 4, 8):
                for num_warps in NUM_WARPS:
                    cfg = KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                                        num_warps=num_warps, pdl=pdl)
                    if self.is_valid(key, cfg):
                        out.append(cfg)
        if pdl:
            out.insert(0, self.heuristic(key).model_copy(update={"pdl": False}))
        return out

    def is_valid(self, key: KVWriteKey, config: KVWriteConfig) -> bool:  # type: ignore[override]
        if config.variant == "indexed":
            # Skipping rows by mask or active count would need a host sync: never allowed.
            return key.masking == "none" and not config.pdl
        if config.pdl and not pdl_capable(key):
            return False
        if config.block_h > triton.next_power_of_2(key.num_kv_heads):
            return False
        if config.block_t > key.tokens:
            return False
        tile = config.block_t * config.block_h * triton.next_power_of_2(key.head_dim)
        if tile > MAX_TILE or tile > MAX_ELEMS_PER_THREAD * 32 * config.num_warps:
            return False
        # more warps than the tile has 16-byte vectors only adds idle threads
        return config.num_warps == 1 or tile >= 32 * config.num_warps * 4

    def baseline(self, key: KVWriteKey) -> KVWriteConfig:  # type: ignore[override]
        return KVWriteConfig(variant="indexed")

    # -- launching -------------------------------------------------------------------------
    def launch(self, config: OpConfig, **call_args: Any) -> None:
        return launch_kv_write(config, **call_args)  # type: ignore[arg-type]

    # -- tuning hooks ----------------------------------------------------------------------
    def make_inputs(self, key: KVWriteKey, device: Any, seed: int  # type: ignore[override]
                    ) -> dict[str, Any]:
        """Random inputs at ``key``: K/V as strided views of one qkv projection, random
        (never zero) pre-filled caches, unique random slots including the first and last
        slot of the cache; with masking, some negative slots, a random row mask and an
        active-row count below ``tokens``."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        dtype = TORCH_DTYPES[key.dtype]
        num_tokens, num_heads, head_dim = key.tokens, key.num_kv_heads, key.head_dim
        hd = num_heads * head_dim
        page = key.page_size
        num_blocks = max(2, triton.cdiv(2 * num_tokens, page) + 1)
        num_slots = num_blocks * page

        def rand(*shape: int) -> torch.Tensor:
            x = torch.rand(*shape, generator=gen) * 2 - 1
            return (x + torch.where(x >= 0, 0.25, -0.25)).to(dtype).to(device)

        qkv = rand(num_tokens, 3 * hd)
        key_t = qkv[:, hd:2 * hd].view(num_tokens, num_heads, head_dim)
        value_t = qkv[:, 2 * hd:].view(num_tokens, num_heads, head_dim)
        key_cache = rand(num_blocks, page, num_heads, head_dim)
        value_cache = rand(num_blocks, page, num_heads, head_dim)
        # unique interior slots, then the first and the last slot of the cache
        slots = torch.randperm(num_slots - 2, generator=gen)[:num_tokens] + 1
        slots[0] = 0
        if num_tokens > 1:
            slots[-1] = num_slots - 1
        row_mask = active_rows = None
        if key.masking != "none":
            skip = torch.rand(num_tokens, generator=gen) < 0.125
            slots[skip] = -1
        if key.masking in ("row_mask", "both"):
            row_mask = (torch.rand(num_tokens, generator=gen) < 0.75).to(device)
        if key.masking in ("active_rows", "both"):
            n = int(torch.randint(num_tokens // 2, num_tokens + 1, (1,), generator=gen))
            active_rows = torch.tensor([n], dtype=torch.int32, device=device)
        return {"key": key_t, "value": value_t, "key_cache": key_cache,
                "value_cache": value_cache, "slot_mapping": slots.to(device),
                "row_mask": row_mask, "active_rows": active_rows,
                # pristine pools: the reference must not see a candidate's writes
                "initial_key_cache": key_cache.clone(),
                "initial_value_cache": value_cache.clone()}

    @staticmethod
    def _call_args(inputs: Mapping[str, Any]) -> dict[str, Any]:
        names = ("key", "value", "key_cache", "value_cache", "slot_mapping", "row_mask",
                 "active_rows")
        return {n: inputs.get(n) for n in names}

    def run(self, config: OpConfig, inputs: dict[str, Any]
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write in place into ``inputs``' caches; returns the pools ``(k_cache, v_cache)``."""
        args = self._call_args(inputs)
        launch_kv_write(config, **args)  # type: ignore[arg-type]
        return args["key_cache"], args["value_cache"]

    def reference(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 pools after the write, computed from the pristine caches of ``make_inputs``."""
        args = self._call_args(inputs)
        args["key_cache"] = inputs.get("initial_key_cache", args["key_cache"])
        args["value_cache"] = inputs.get("initial_value_cache", args["value_cache"])
        return reference_kv_write(**args)

    def tolerance(self, key: OpKey) -> tuple[float, float]:
        return (0.0, 0.0)  # a copy: bit-exact in every dtype

    def bytes_moved(self, key: KVWriteKey) -> int:  # type: ignore[override]
        """K and V rows read once and written once, plus the int64 slots and the masks."""
        elt = TORCH_DTYPES[key.dtype].itemsize
        rows = key.tokens * key.num_kv_heads * key.head_dim * elt
        extra = key.tokens * 8
        if key.masking in ("row_mask", "both"):
            extra += key.tokens
        if key.masking in ("active_rows", "both"):
            extra += 4
        return 4 * rows + extra


SPEC = KVWriteSpec()
