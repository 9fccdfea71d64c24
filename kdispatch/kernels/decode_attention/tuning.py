"""The tuning face of ``decode_attention``: candidates, random inputs, reference, tolerance."""

from __future__ import annotations

from typing import Any

import torch

from kdispatch.dtypes import is_fp8, itemsize, torch_dtype
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.decode_attention import spec
from kdispatch.kernels.decode_attention.launch import launch_decode_attention, planned_launches
from kdispatch.kernels.decode_attention.reference import reference_decode_attention
from kdispatch.kernels.decode_attention.spec import DecodeConfig
from kdispatch.opdef import OpTuning

#: the fp8 cache dtype model presets tune beside their own (vLLM's ``kv_cache_dtype="fp8"``)
PRESET_FP8 = "float8_e4m3fn"
#: query tokens per request of MLA presets' multi-token keys (DeepSeek-style MTP: 1 + 1)
PRESET_MTP_Q_LEN = 2


class DecodeTuning(OpTuning):
    ceiling = "read"

    def candidates(self, key: Any) -> list[DecodeConfig]:
        h = spec.heuristic(key)
        base1 = key.batch * key.num_kv_heads * spec.cdiv(key.rows, h.block_h)
        splits = {1, h.num_kv_splits, max(1, h.num_kv_splits // 2), h.num_kv_splits * 2}
        splits |= {spec.cdiv(w * key.cu_count, base1) for w in (1, 2, 4)}
        splits |= {max(1, w * key.cu_count // base1) for w in (1, 2, 4)}  # whole waves
        splits = {min(s, max(1, key.context // 16)) for s in splits}
        cap = min(spec.MAX_SPLITS, spec.max_splits_for_budget(key))
        splits = sorted(s for s in splits if s <= cap)
        if key.latent or key.head_dim > 256:
            tiles = [(32, 4, 2), (64, 8, 2), (32, 4, 3), (64, 4, 2), (32, 8, 2), (16, 4, 3),
                     (16, 8, 3), (32, 8, 3)]
        else:
            tiles = [(128, 4, 2), (128, 8, 2), (64, 4, 3), (64, 4, 2), (128, 4, 3), (32, 4, 2)]
        heads = sorted({h.block_h} | {b for b in (16, 32, 64) if b <= spec.p2(key.rows)})
        # order: the heuristic, then its one-step variants (split count, tile, or row block
        # at the heuristic's tile for that block), nearest first, then the rest; a truncated
        # sweep (--max-cands) keeps the most telling ones. A smaller row block splits a kv
        # head's rows (query tokens x heads) over programs that read the same latent tiles
        # at about the same time (L2 serves the second read)
        split_rank = {s: abs(i - splits.index(h.num_kv_splits)) if h.num_kv_splits in splits
                      else i for i, s in enumerate(splits)}
        split_rank[1] = 99  # an unsplit grid ranks last among its tile's variants
        out: list[tuple[tuple, DecodeConfig]] = []
        seen = set()
        for bh in heads:
            h_tile = (h.block_n, h.num_warps, h.num_stages)
            if key.latent and bh != h.block_h:
                h_tile = spec.latent_tile(key, bh)
            bh_tiles = [h_tile] + [t for t in tiles if t != h_tile]
            for s in splits:
                for ti, (bn, w, st) in enumerate(bh_tiles):
                    for warps in ((w, 8) if bh >= 64 else (w,)):
                        cfg = DecodeConfig(num_kv_splits=s, block_n=bn, block_h=bh,
                                           num_warps=warps, num_stages=st,
                                           merge=spec.merges(key, s))
                        if cfg in seen or not spec.is_valid(key, cfg):
                            continue
                        seen.add(cfg)
                        sr = split_rank[s]
                        steps = (sr > 0) + (ti > 0) + (bh != h.block_h)
                        rank = (cfg != h, steps > 1, sr + ti + (bh != h.block_h), ti)
                        out.append((rank, cfg))
        gluon_tiles = [spec.gluon_config] if spec.gluon_fits(key) else []
        if spec.narrow_fits(key):
            gluon_tiles.append(lambda s: spec.narrow_config(s, key.rows))
        for tile in gluon_tiles:  # the Gluon tiles at every split count, after the heuristic
            for s in splits:
                cfg = tile(s)
                if cfg not in seen and spec.is_valid(key, cfg):
                    seen.add(cfg)
                    out.append(((cfg != h, False, split_rank[s], 0), cfg))
        if spec.gluon_fits(key):
            # the 64-row tile over the device's work plan (batches of several requests),
            # ranked with the heuristic's one-step variants
            for s in spec.PLAN_SPLITS if key.batch > 1 else ():
                cfg = spec.gluon_config(s, plan=True)
                if spec.is_valid(key, cfg):
                    out.append(((cfg != h, False, 1, 0), cfg))
        out.sort(key=lambda rc: rc[0])
        chosen = [c for _, c in out[:spec.MAX_CANDIDATES]]
        base = spec.baseline(key)
        if base not in chosen and spec.is_valid(key, base):
            chosen.insert(min(len(chosen), 6), base)
        # the heuristic's tile with the other two ways to merge the splits (a reduce launched
        # early; the last stage-1 program merging), right after the heuristic
        for twin in (h.model_copy(update={"pdl": True, "merge": False}),
                     h.model_copy(update={"pdl": False, "merge": not h.merge})):
            if twin != h and twin not in chosen and spec.is_valid(key, twin):
                chosen.insert(1, twin)
        if h not in chosen:  # a heuristic with the early reduce (short GQA calls) leads, and
            chosen.insert(0, h)  # its plain twin (the nearest variant above) comes next
        return chosen[:spec.MAX_CANDIDATES]

    def make_inputs(self, key: Any, device: Any, seed: int) -> dict[str, Any]:
        """Random inputs at the key's batch and context (capped on the CPU interpreter).

        Pages are a random permutation and every request is at full capacity, so the
        tuner's times and :meth:`bytes_moved` describe the same work (GB/s is exact);
        ragged lengths are covered by the kernel tests. MLA keys get one latent cache
        with ``v_cache = k_cache[..., :head_dim_v]``. ``q_len > 1`` keys get a 4-D q;
        fp8 keys a cache quantized from ``randn / scale`` with random per-tensor scales
        (so the dequantized values are about unit-scale, like the bf16 inputs).
        """
        dev = torch.device(device)
        # drawn on the device: a CPU draw of a multi-GB cache dominated the tuner's time
        g = torch.Generator(device=dev).manual_seed(seed)
        batch, context = key.batch, key.context
        if dev.type == "cpu":  # the interpreter is slow: keep smoke inputs tiny
            batch, context = min(batch, 2), min(context, 256)
        page = key.page_size
        pages = spec.cdiv(context, page)
        cap = pages * page
        if key.sliding:  # a window as large as the bucket, over a longer cache
            window, pages, cap = context, pages * 2, cap * 2
        else:
            window = None
        num_blocks = batch * pages + 3
        qd, kd = torch_dtype(key.dtype), torch_dtype(key.kv_dtype)

        def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.randn(shape, generator=g, device=dev).to(dtype)

        q_shape = (batch, key.num_q_heads, key.head_dim)
        if key.q_len > 1:
            q_shape = (batch, key.q_len, key.num_q_heads, key.head_dim)
        q = randn(*q_shape, dtype=qd)
        k_scale = v_scale = None
        if is_fp8(key.kv_dtype):
            k_scale, v_scale = (torch.rand(1, generator=g, device=dev) * 0.02 + 0.01
                                for _ in range(2))

        def cache(dim: int, s: Any) -> torch.Tensor:
            shape = (num_blocks, page, key.num_kv_heads, dim)
            if s is None:  # drawn in the cache dtype: no fp32 copy of a multi-GB cache
                return torch.randn(shape, generator=g, device=dev, dtype=kd)
            return quantize_fp8(torch.randn(shape, generator=g, device=dev), s, kd)

        k_cache = cache(key.head_dim, k_scale)
        if key.latent:
            v_cache = k_cache[..., :key.head_dim_v]
            v_scale = k_scale
        else:
            v_cache = cache(key.head_dim_v, v_scale)
        perm = torch.randperm(num_blocks, generator=g, device=dev)[:batch * pages]
        block_table = perm.view(batch, pages).to(torch.int32)
        lens = torch.full((batch,), cap, dtype=torch.int32, device=dev)
        return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
                "seq_lens": lens, "scale": key.head_dim ** -0.5,
                "sliding_window": window, "logit_cap": 0.0, "k_scale": k_scale,
                "v_scale": v_scale}

    def run(self, config: Any, inputs: dict[str, Any]) -> Any:
        return launch_decode_attention(config, **inputs)

    def launches(self, config: Any, inputs: dict[str, Any]) -> list[Any]:
        return planned_launches(config, **inputs)

    def reference(self, inputs: dict[str, Any]) -> Any:
        return reference_decode_attention(**inputs)

    def tolerance(self, key: Any) -> tuple[float, float]:
        # fp32: IEEE dots (input_precision="ieee"), only summation order differs: ~1e-6,
        #   2e-4 leaves room for exp2 vs exp and long reductions.
        # fp16: P is rounded to fp16 (2^-11) before the PV dot and the output is rounded
        #   once more: ~1e-3 worst case on O(1) outputs.
        # bf16: the same with an 8-bit mantissa (2^-8 per rounding): ~1e-2.
        # An fp8 cache is checked against the reference on the dequantized cache: fp8 ->
        #   fp16 (its dot dtype) is exact, P in fp16 rounds finer than bf16 and the scales
        #   are applied in fp32, so the tolerance is q's dtype's.
        return {"float32": (2e-4, 2e-4), "float16": (5e-3, 5e-3),
                "bfloat16": (2e-2, 2e-2)}[key.dtype]

    def bytes_moved(self, key: Any) -> int:
        """The live cache read once (in its dtype: fp8 counts one byte), q read and the
        output written once per new token."""
        kd = itemsize(key.kv_dtype)
        qd = itemsize(key.dtype)
        per_token = key.num_kv_heads * (key.head_dim if key.latent
                                        else key.head_dim + key.head_dim_v)
        kv = key.batch * key.context * per_token * kd
        rows = key.batch * key.q_len * key.num_q_heads
        return kv + rows * (key.head_dim + key.head_dim_v) * qd

    def baseline(self, key: Any) -> DecodeConfig:
        return spec.baseline(key)

    def preset_args(self, model: Any) -> list[dict[str, Any]]:
        """One decode key per (batch, context) pair of the model, with its own cache dtype
        and, for a bf16 model with ``fp8_kv``, an fp8 cache (bf16 q); MLA models (latent
        head dims) also with two query tokens per request (multi-token prediction), in
        every cache dtype."""
        fp8 = model.fp8_kv and model.dtype == "bfloat16"
        kv_dtypes = [model.dtype] + ([PRESET_FP8] if fp8 else [])
        dv = model.head_dim_v or model.head_dim
        mla = model.num_kv_heads == 1 and dv < model.head_dim
        out = []
        for q_len in (1, PRESET_MTP_Q_LEN) if mla else (1,):
            for kv in kv_dtypes:
                out += [{"batch": b, "context": c, "num_q_heads": model.num_q_heads,
                         "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim,
                         "head_dim_v": dv, "page_size": model.page_size, "dtype": model.dtype,
                         "kv_dtype": kv, "q_len": q_len}
                        for b, c in model.decode]
        return out
