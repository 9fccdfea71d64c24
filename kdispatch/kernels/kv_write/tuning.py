"""The tuning face of ``kv_write``: candidates, random inputs, reference, tolerance, bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton

from kdispatch.dtypes import itemsize, torch_dtype
from kdispatch.kernels._common import pdl_capable
from kdispatch.kernels.kv_write import spec
from kdispatch.kernels.kv_write.launch import launch_kv_write, launches
from kdispatch.kernels.kv_write.reference import reference_kv_write
from kdispatch.opdef import NUM_WARPS, OpTuning

_CALL_ARGS = ("key", "value", "key_cache", "value_cache", "slot_mapping", "row_mask",
              "active_rows", "k_scale", "v_scale")
#: the fp8 cache dtype model presets tune beside their own (vLLM's ``kv_cache_dtype="fp8"``)
PRESET_FP8 = "float8_e4m3fn"


def _call_args(inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {n: inputs.get(n) for n in _CALL_ARGS}


class KVWriteTuning(OpTuning):
    ceiling = "copy"
    #: a writer kernel compiles in ~0.3 s, a decode stage 1 in ~1 s: a preset's writes are
    #: timed first, while the pool compiles the decode keys' kernels
    time_first = True

    def candidates(self, key: Any) -> list[spec.KVWriteConfig]:
        # with pdl available every tile is tried with it, and the heuristic's tile without
        # (first, so a capped sweep keeps the comparison)
        pdl = pdl_capable(key)
        out = []
        for block_h in (1, 2, 4, 8, 16, 32, 64):
            for block_t in (1, 2, 4, 8):
                for num_warps in NUM_WARPS:
                    cfg = spec.KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                                             num_warps=num_warps, pdl=pdl)
                    if spec.is_valid(key, cfg):
                        out.append(cfg)
        if pdl:
            out.insert(0, spec.heuristic(key).model_copy(update={"pdl": False}))
        return out

    def baseline(self, key: Any) -> spec.KVWriteConfig | None:
        # two indexed assignments: cannot skip masked rows, so only unmasked keys compare
        return spec.KVWriteConfig(variant="indexed") if key.masking == "none" else None

    def make_inputs(self, key: Any, device: Any, seed: int) -> dict[str, Any]:
        """Random inputs at ``key``: K/V as strided views of one qkv projection, random
        (never zero) pre-filled caches, unique random slots including the first and last
        slot of the cache; with masking, some negative slots, a random row mask and an
        active-row count below ``tokens``. Into an fp8 cache: random per-tensor scales that
        map the rows' +-1.25 to +-[500, 625], so the largest values saturate (at 448).

        The rows and caches are drawn on ``device`` (on the host, a 16,384-token key's
        cost ~1.5 s of the tuner's serial work); slots, masks and scales on the host."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        dgen = torch.Generator(device=device).manual_seed(seed)
        dtype = torch_dtype(key.dtype)
        cache_dtype = torch_dtype(key.kv_dtype)
        num_tokens, num_heads, head_dim = key.tokens, key.num_kv_heads, key.head_dim
        hd = num_heads * head_dim
        page = key.page_size
        num_blocks = max(2, triton.cdiv(2 * num_tokens, page) + 1)
        num_slots = num_blocks * page

        def rand(*shape: int) -> torch.Tensor:
            x = torch.rand(*shape, generator=dgen, device=device) * 2 - 1
            return (x + torch.where(x >= 0, 0.25, -0.25)).to(dtype)

        qkv = rand(num_tokens, 3 * hd)
        key_t = qkv[:, hd:2 * hd].view(num_tokens, num_heads, head_dim)
        value_t = qkv[:, 2 * hd:].view(num_tokens, num_heads, head_dim)
        key_cache = rand(num_blocks, page, num_heads, head_dim).to(cache_dtype)
        value_cache = rand(num_blocks, page, num_heads, head_dim).to(cache_dtype)
        k_scale = v_scale = None
        if cache_dtype != dtype:
            k_scale, v_scale = ((torch.rand(1, generator=gen) * 5e-4 + 2e-3).to(device)
                                for _ in range(2))
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
                "k_scale": k_scale, "v_scale": v_scale,
                # pristine pools: the reference must not see a candidate's writes
                "initial_key_cache": key_cache.clone(),
                "initial_value_cache": value_cache.clone()}

    def run(self, config: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Write in place into ``inputs``' caches; returns the pools ``(k_cache, v_cache)``."""
        args = _call_args(inputs)
        launch_kv_write(config, **args)
        return args["key_cache"], args["value_cache"]

    def launches(self, config: Any, inputs: dict[str, Any]) -> list[Any]:
        return launches(config, **_call_args(inputs))[1]

    def reference(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 pools after the write, computed from the pristine caches of ``make_inputs``."""
        args = _call_args(inputs)
        args["key_cache"] = inputs.get("initial_key_cache", args["key_cache"])
        args["value_cache"] = inputs.get("initial_value_cache", args["value_cache"])
        return reference_kv_write(**args)

    def tolerance(self, key: Any) -> tuple[float, float]:
        return (0.0, 0.0)  # a copy: bit-exact in every dtype

    def bytes_moved(self, key: Any) -> int:
        """K and V rows read once and written once (in the cache's dtype), plus the int64
        slots, the masks and the scales."""
        elems = key.tokens * key.num_kv_heads * key.head_dim
        extra = key.tokens * 8
        if key.masking in ("row_mask", "both"):
            extra += key.tokens
        if key.masking in ("active_rows", "both"):
            extra += 4
        if key.kv_dtype != key.dtype:
            extra += 8
        return 2 * elems * (itemsize(key.dtype) + itemsize(key.kv_dtype)) + extra

    def preset_args(self, model: Any) -> list[dict[str, Any]]:
        """One write per token count of the model (its KV heads; the latent for MLA) into
        a cache of the model's dtype and, for a bf16 model with ``fp8_kv``, into an fp8
        cache."""
        fp8 = model.fp8_kv and model.dtype == "bfloat16"
        kv_dtypes = [model.dtype] + ([PRESET_FP8] if fp8 else [])
        return [{"tokens": t, "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim,
                 "page_size": model.page_size, "dtype": model.dtype, "kv_dtype": kv}
                for kv in kv_dtypes for t in model.write_tokens]
