"""Dispatch spec of ``decode_attention``: key, config, heuristic, candidate space, pruning.

The key is built from shapes, dtypes and the device only. The context field is the
*capacity* ``block_table.shape[1] * page_size`` (or the sliding window when smaller),
bucketed with :func:`~kdispatch.buckets.half_pow2_bucket`; ``seq_lens`` values are never
read, so a config resolved at CUDA-graph capture holds at every replay.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import torch
from pydantic import Field, field_validator, model_validator

from kdispatch.buckets import half_pow2_bucket, pow2_bucket
from kdispatch.device import Device
from kdispatch.kernels._common import TORCH_DTYPES, dtype_name, pdl_capable
from kdispatch.registry import DType, OpConfig, OpKey, OpSpec, check_pow2, ladder

MAX_SPLITS = 256
#: partials (fp32 out + lse) may take at most this many bytes at the key's batch bucket
WORKSPACE_BUDGET = 512 << 20
#: batch_invariant keys pin batch to 1; their workspace is budgeted for this many rows
INVARIANT_NOMINAL_BATCH = 64
MAX_CANDIDATES = 60

# (limit, value) ladders; the first row whose limit is >= the argument applies.
#: programs (batch x head blocks) at one split -> whether to split at all (1 = no split).
#: Split-KV pays only below a few waves; BENCHMARKING.md: GQA batch 64 x 8k (512 programs,
#: ~3.9 waves of 132 SMs) is ~91% of the read ceiling with or without splits.
SPLIT_OFF_WAVES = 2.0
#: GQA/MHA split count: the one whose programs come nearest PROGRAMS_PER_SM x SMs. H200
#: sweep (bench/results/nvidia-h200/session4/decode_sweep.json, 64-token tile, 3 stages):
#: b4 x 262k at 8 splits (256 programs) 99.0% of the read ceiling vs 84.5% at 9 (288);
#: b8 x 32k at 4 splits (256) 92.9% vs 83.9% at 5 (320); b1 x 8k at 16-33 splits 40-41%.
GQA_PROGRAMS_PER_SM = 2
#: minimum BLOCK_N tiles per split, by context bucket: a split's fixed cost is about one
#: to two tiles (q load, partial store, reduce read), so <4 tiles wastes most of it.
MIN_TILES_PER_SPLIT: tuple[tuple[int, int], ...] = (
    (4096, 2),        # short contexts: latency dominates, split finely to fill the device
    (1 << 30, 4),     # long contexts: at least 4 tiles amortize the per-split cost
)
#: Absorbed MLA (latent keys) fills whole waves of resident programs instead: programs
#: = floor(slots / base) * base, slots = SMs x resident programs per SM (2 for the 32-token
#: 12-16-head tile, 1 for 64-head blocks). H200 v3 (docs/decode_notes.md): deepseek TP8
#: b32 x 16k at 8 splits (256 programs) 171 us vs 235 us at ceil's 9 (288: a 24-program
#: tail wave); TP1 128 heads best at 2 splits (128 programs at 1 per SM).
LATENT_PROGRAMS_PER_SM = 2
LATENT_PROGRAMS_PER_SM_WIDE = 1
#: minimum tiles per split for latent keys: kimi b1 x 65,536 at 132 splits (15.5 tiles)
#: 39.6 us vs 44.8 us at 264 (7.8 tiles), H200 v3
LATENT_MIN_TILES_PER_SPLIT = 16
#: BLOCK_N by padded q/k head dim. H200 session-4 sweep: GQA D=128 at 64 tokens with a
#: 3-deep pipeline beats 128 tokens at 2 stages at every split count's best (b4 x 262k:
#: 99.0% vs 97.6%; b8 x 32k: 92.9% vs 91.0%; b1 x 8k: 41.1% vs 37.6%); (at 2 stages 128
#: tokens had won, docs/decode_notes.md v1). The 576-wide MLA tile is fastest at 32 tokens
#: (kimi b8 x 327,600: 951 vs 1366 us at 64).
BLOCK_N_BY_DIM: tuple[tuple[int, int], ...] = ((256, 64), (1 << 20, 32))
#: BLOCK_N for wide MLA head blocks (block_h >= 64): 128 heads at 64 tokens beat 32
#: (H200 v1: 848 vs 1174 us at batch 32 x 16k).
BLOCK_N_WIDE_HEADS = 64
#: latent (MLA) grids of at most this many splits merge in the last stage-1 program instead
#: of a reduce kernel. The merge is serial in the splits. H200 session 6, with the faster
#: reduce launch (bench/results/nvidia-h200/session6/, merge vs its reduce-kernel twin):
#: TP1 128 heads at 2 splits 572.8 vs 614.5 us; at 8 splits the reduce kernel now wins at
#: b32 x 16k (159.1 vs 164.0 us; session 5, with the slower reduce, merged up to 8), while
#: b32 x 327,600 went either way between calls (2,985 vs 2,786; 3,098 vs 3,152). 33 and
#: more splits lose badly (kimi b1 x 65,536: 165 vs 39 us). GQA grids lost 1-3% with it at
#: 2-8 splits and keep the reduce kernel.
MERGE_MAX_SPLITS_LATENT = 4
SMEM_LIMIT = 220 * 1024  # Hopper: 227 KB per block, minus some for the compiler
ACC_REGS_LIMIT = 128     # fp32 accumulator values per thread before spilling is likely


def _p2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DecodeKey(OpKey):
    """Dispatch key of ``decode_attention`` (device fields + shapes, bucketed)."""

    dtype: DType
    kv_dtype: DType
    num_q_heads: int = Field(ge=1, le=4096)
    num_kv_heads: int = Field(ge=1, le=4096)
    head_dim: int = Field(ge=1, le=1024)
    head_dim_v: int = Field(ge=1, le=1024)
    page_size: int = Field(ge=1, le=4096)
    batch: int = Field(ge=1, le=1 << 20)
    context: int = Field(ge=1, le=1 << 30)
    sliding: bool = False
    batch_invariant: bool = False

    @model_validator(mode="after")
    def _check(self) -> DecodeKey:
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads {self.num_q_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.head_dim_v > self.head_dim:
            raise ValueError(f"head_dim_v {self.head_dim_v} > head_dim {self.head_dim}")
        if self.batch_invariant and self.batch != 1:
            raise ValueError("batch must be 1 when batch_invariant (the split count may not "
                             "depend on the batch)")
        return self

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def latent(self) -> bool:
        """Absorbed-MLA shape: one kv head whose V is the first head_dim_v K columns."""
        return self.num_kv_heads == 1 and self.head_dim_v < self.head_dim


class DecodeConfig(OpConfig):
    """Launch config of ``decode_attention`` (all fields become constexprs / grid)."""

    num_kv_splits: int = Field(default=1, ge=1, le=MAX_SPLITS)
    block_n: int = 64
    block_h: int = 16
    num_warps: int = 4
    num_stages: int = Field(default=2, ge=1, le=5)
    #: launch the reduce as a programmatic dependent launch (NVIDIA sm_90+, splits > 1)
    pdl: bool = False
    #: no reduce kernel: the last stage-1 program of a request merges the splits (splits > 1)
    merge: bool = False

    @field_validator("block_n")
    @classmethod
    def _block_n(cls, v: int) -> int:
        return check_pow2("block_n", v, 16, 256)

    @field_validator("block_h")
    @classmethod
    def _block_h(cls, v: int) -> int:
        return check_pow2("block_h", v, 16, 128)


def _workspace_bytes(key: DecodeKey, splits: int) -> int:
    if splits == 1:
        return 0
    rows = INVARIANT_NOMINAL_BATCH if key.batch_invariant else key.batch
    return rows * key.num_q_heads * splits * (key.head_dim_v + 1) * 4


def _max_splits_for_budget(key: DecodeKey) -> int:
    rows = INVARIANT_NOMINAL_BATCH if key.batch_invariant else key.batch
    per_split = rows * key.num_q_heads * (key.head_dim_v + 1) * 4
    return max(1, min(MAX_SPLITS, WORKSPACE_BUDGET // per_split))


def _smem_bytes(key: DecodeKey, cfg: DecodeConfig) -> int:
    esize = TORCH_DTYPES[key.kv_dtype].itemsize
    dv = max(16, _p2(key.head_dim_v))
    dpe = key.head_dim - key.head_dim_v
    dpe = max(16, _p2(dpe)) if dpe else 0
    cols = dv + dpe + (0 if key.latent else dv)
    return max(1, cfg.num_stages - 1) * cfg.block_n * cols * esize + \
        cfg.block_h * (dv + dpe) * TORCH_DTYPES[key.dtype].itemsize


def _default_block_h(key: DecodeKey) -> int:
    g = key.group
    if g <= 16:
        return 16
    return min(64, _p2(g))  # aiter bh64-style regime for wide MLA (128 heads: 2 blocks)


def _merges(key: DecodeKey, splits: int) -> bool:
    """Whether a grid of ``splits`` merges in its last stage-1 program (no reduce kernel).

    NVIDIA only, where it was measured; elsewhere the merge stays a tuning candidate (the
    tuner verifies it before timing it) until a device of that vendor has measured it.
    """
    return key.vendor == "nvidia" and key.latent and 1 < splits <= MERGE_MAX_SPLITS_LATENT


def _split_count(key: DecodeKey, block_h: int, block_n: int) -> int:
    batch = key.batch  # 1 for batch_invariant keys: the count depends on shapes only
    base = batch * key.num_kv_heads * _cdiv(key.group, block_h)
    if not key.batch_invariant and base >= SPLIT_OFF_WAVES * key.cu_count:
        return 1
    if key.latent:
        per_sm = LATENT_PROGRAMS_PER_SM_WIDE if block_h >= 64 else LATENT_PROGRAMS_PER_SM
        splits = max(1, per_sm * key.cu_count // base)
        min_tokens = LATENT_MIN_TILES_PER_SPLIT * block_n
    else:
        splits = max(1, round(GQA_PROGRAMS_PER_SM * key.cu_count / base))
        min_tokens = ladder(MIN_TILES_PER_SPLIT, key.context) * block_n
    splits = min(splits, max(1, key.context // min_tokens), _max_splits_for_budget(key))
    return max(1, splits)


class DecodeSpec(OpSpec):
    """The ``decode_attention`` op: split-KV paged decode attention (GQA/MHA, MLA)."""

    name = "decode_attention"
    key_model = DecodeKey
    config_model = DecodeConfig
    source_modules = ("kdispatch.kernels.decode_attention",)

    # -- resolution ---------------------------------------------------------------------
    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        """Exactly what :meth:`key` reads; attribute reads only (the resolve hot path)."""
        q = args.get("q")
        if q is not None:
            try:
                k = args["k_cache"]
                return (q.shape, q.dtype, q.device, k.shape, k.dtype, args["v_cache"].shape,
                        args["block_table"].shape, args.get("sliding_window"),
                        args.get("batch_invariant", False))
            except (AttributeError, KeyError):  # not tensors: key() names the argument
                return ("invalid", id(args))
        # every plain argument as given (a different order is merely another memo entry)
        return tuple(args.items())

    def device_of(self, args: Mapping[str, Any]) -> Device | str | None:
        q = args.get("q")
        if isinstance(q, torch.Tensor):
            return q.device
        return args.get("device")

    def key(self, device: Device, args: Mapping[str, Any]) -> DecodeKey:
        window = args.get("sliding_window")
        invariant = bool(args.get("batch_invariant", False))
        q = args.get("q")
        if isinstance(q, torch.Tensor):
            from kdispatch.kernels.decode_attention import check_decode_inputs
            check_decode_inputs(q, args.get("k_cache"), args.get("v_cache"),
                                args.get("block_table"), args.get("seq_lens"))
            k, v, bt = args["k_cache"], args["v_cache"], args["block_table"]
            fields = dict(dtype=dtype_name(q.dtype, "q"), kv_dtype=dtype_name(k.dtype, "k_cache"),
                          num_q_heads=q.shape[1], num_kv_heads=k.shape[2],
                          head_dim=q.shape[2], head_dim_v=v.shape[3], page_size=k.shape[1],
                          batch=q.shape[0], context=bt.shape[1] * k.shape[1])
        else:
            dtype = dtype_name(args.get("dtype", "bfloat16"), "dtype")
            fields = dict(dtype=dtype, kv_dtype=dtype_name(args.get("kv_dtype") or dtype,
                                                           "kv_dtype"),
                          num_q_heads=int(args["num_q_heads"]),
                          num_kv_heads=int(args["num_kv_heads"]),
                          head_dim=int(args["head_dim"]),
                          head_dim_v=int(args.get("head_dim_v") or args["head_dim"]),
                          page_size=int(args.get("page_size", 16)), batch=int(args["batch"]),
                          context=int(args["context"]))
        if window is not None:
            if isinstance(window, bool) or int(window) < 1:
                raise ValueError(f"sliding_window: must be None or an int >= 1, got {window!r}")
            fields["context"] = min(fields["context"], int(window))
        fields["context"] = half_pow2_bucket(fields["context"], floor=16)
        fields["batch"] = 1 if invariant else pow2_bucket(fields["batch"])
        return DecodeKey(**OpKey.device_fields(device), **fields, sliding=window is not None,
                         batch_invariant=invariant)

    def heuristic(self, key: DecodeKey) -> DecodeConfig:  # type: ignore[override]
        block_h = _default_block_h(key)
        block_n = ladder(BLOCK_N_BY_DIM, _p2(key.head_dim))
        if block_h >= 64:
            block_n = BLOCK_N_WIDE_HEADS
        warps = 8 if block_h >= 64 else 4
        splits = _split_count(key, block_h, block_n)
        # H200: a 3-deep pipeline for the 32-token MLA tile (v2: kimi b8 x 327,600: 830 vs
        # 993 us) and for the 64-token GQA tile of a split grid of ~2 programs per SM
        # (session 4: b8 x 32k 92.9% vs 70.4% at 2 stages); an unsplit GQA grid is several
        # waves deep and wants the smaller footprint of 2 stages (session 4 tuning, b64:
        # 98-100% vs 79-81% at 3 stages; huginn b8: 76% vs 62%)
        if key.latent:
            stages = 3 if block_n <= 32 and block_h < 64 else 2
        else:
            stages = 3 if splits > 1 else 2
        # pdl stays off: launching the reduce early measured -3..+3% on most H200 shapes and
        # 9-15% slower at MLA batch 1 with 128-256 splits (session 4d, decode-pdl.json)
        cfg = DecodeConfig(num_kv_splits=splits, block_n=block_n, block_h=block_h,
                           num_warps=warps, num_stages=stages, merge=_merges(key, splits))
        while not self.is_valid(key, cfg) and cfg.block_n > 16:
            cfg = cfg.model_copy(update={"block_n": cfg.block_n // 2})
        return cfg

    def baseline(self, key: DecodeKey) -> DecodeConfig:  # type: ignore[override]
        return self.heuristic(key).model_copy(update={"num_kv_splits": 1, "pdl": False,
                                                      "merge": False})

    def is_valid(self, key: DecodeKey, config: DecodeConfig) -> bool:  # type: ignore[override]
        if config.block_h > max(16, _p2(key.group)):
            return False
        if config.pdl and (config.num_kv_splits == 1 or not pdl_capable(key)):
            return False  # no reduce to launch early / no griddepcontrol on the device
        if config.merge and (config.num_kv_splits == 1 or config.pdl):
            return False  # nothing to merge / no reduce kernel to launch early
        if _workspace_bytes(key, config.num_kv_splits) > WORKSPACE_BUDGET:
            return False
        if key.vendor != "triton":  # GPU resource limits (the interpreter has none)
            if _smem_bytes(key, config) > SMEM_LIMIT:
                return False
            acc = config.block_h * max(16, _p2(key.head_dim_v)) / (config.num_warps * 32)
            if acc > ACC_REGS_LIMIT:
                return False
        return True

    def candidates(self, key: DecodeKey) -> Iterable[DecodeConfig]:  # type: ignore[override]
        h = self.heuristic(key)
        base1 = key.batch * key.num_kv_heads * _cdiv(key.group, h.block_h)
        splits = {1, h.num_kv_splits, max(1, h.num_kv_splits // 2), h.num_kv_splits * 2}
        splits |= {_cdiv(w * key.cu_count, base1) for w in (1, 2, 4)}
        splits |= {max(1, w * key.cu_count // base1) for w in (1, 2, 4)}  # whole waves
        splits = {min(s, max(1, key.context // 16)) for s in splits}
        splits = sorted(s for s in splits if s <= min(MAX_SPLITS, _max_splits_for_budget(key)))
        if key.latent or key.head_dim > 256:
            tiles = [(32, 4, 2), (64, 8, 2), (32, 4, 3), (64, 4, 2), (32, 8, 2), (16, 4, 3)]
        else:
            tiles = [(128, 4, 2), (128, 8, 2), (64, 4, 3), (64, 4, 2), (128, 4, 3), (32, 4, 2)]
        h_tile = (h.block_n, h.num_warps, h.num_stages)
        tiles = [h_tile] + [t for t in tiles if t != h_tile]
        heads = sorted({h.block_h} | {b for b in (16, 32, 64) if b <= _p2(key.group)})
        # order: the heuristic, split-count variants at its tile, tile variants at its split
        # count, then the rest; a truncated sweep (--max-cands) keeps the most telling ones
        split_rank = {s: abs(i - splits.index(h.num_kv_splits)) if h.num_kv_splits in splits
                      else i for i, s in enumerate(splits)}
        out: list[tuple[tuple, DecodeConfig]] = []
        seen = set()
        for bh in heads:
            for s in splits:
                for ti, (bn, w, st) in enumerate(tiles):
                    for warps in ((w, 8) if bh >= 64 else (w,)):
                        cfg = DecodeConfig(num_kv_splits=s, block_n=bn, block_h=bh,
                                           num_warps=warps, num_stages=st,
                                           merge=_merges(key, s))
                        if cfg in seen or not self.is_valid(key, cfg):
                            continue
                        seen.add(cfg)
                        sr = split_rank[s] if s != 1 else 99
                        rank = (cfg != h, min(sr, ti) > 0, bh != h.block_h, sr + ti, ti)
                        out.append((rank, cfg))
        out.sort(key=lambda rc: rc[0])
        chosen = [c for _, c in out[:MAX_CANDIDATES]]
        base = self.baseline(key)
        if base not in chosen and self.is_valid(key, base):
            chosen.insert(min(len(chosen), 6), base)
        # the heuristic's tile with the other two ways to merge the splits (a reduce launched
        # early; the last stage-1 program merging), right after the heuristic
        for twin in (h.model_copy(update={"pdl": True, "merge": False}),
                     h.model_copy(update={"pdl": False, "merge": not h.merge})):
            if twin != h and twin not in chosen and self.is_valid(key, twin):
                chosen.insert(1, twin)
        return chosen[:MAX_CANDIDATES]

    # -- launching ------------------------------------------------------------------------
    def launch(self, config: DecodeConfig, **call_args: Any) -> Any:  # type: ignore[override]
        from kdispatch.kernels.decode_attention import launch_decode_attention
        return launch_decode_attention(config, **call_args)

    # -- tuning hooks ---------------------------------------------------------------------
    def make_inputs(self, key: DecodeKey, device: Any, seed: int) -> dict[str, Any]:  # type: ignore[override]
        """Random inputs at the key's batch and context (capped on the CPU interpreter).

        Pages are a random permutation and every request is at full capacity, so the
        tuner's times and :meth:`bytes_moved` describe the same work (GB/s is exact);
        ragged lengths are covered by the kernel tests. MLA keys get one latent cache
        with ``v_cache = k_cache[..., :head_dim_v]``.
        """
        dev = torch.device(device)
        # drawn on the device: a CPU draw of a multi-GB cache dominated the tuner's time
        g = torch.Generator(device=dev).manual_seed(seed)
        batch, context = key.batch, key.context
        if dev.type == "cpu":  # the interpreter is slow: keep smoke inputs tiny
            batch, context = min(batch, 2), min(context, 256)
        page = key.page_size
        pages = _cdiv(context, page)
        cap = pages * page
        if key.sliding:  # a window as large as the bucket, over a longer cache
            window, pages, cap = context, pages * 2, cap * 2
        else:
            window = None
        num_blocks = batch * pages + 3
        qd, kd = TORCH_DTYPES[key.dtype], TORCH_DTYPES[key.kv_dtype]

        def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.randn(shape, generator=g, device=dev).to(dtype)

        q = randn(batch, key.num_q_heads, key.head_dim, dtype=qd)
        k_cache = randn(num_blocks, page, key.num_kv_heads, key.head_dim, dtype=kd)
        if key.latent:
            v_cache = k_cache[..., :key.head_dim_v]
        else:
            v_cache = randn(num_blocks, page, key.num_kv_heads, key.head_dim_v, dtype=kd)
        perm = torch.randperm(num_blocks, generator=g, device=dev)[:batch * pages]
        block_table = perm.view(batch, pages).to(torch.int32)
        lens = torch.full((batch,), cap, dtype=torch.int32, device=dev)
        return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
                "seq_lens": lens, "scale": key.head_dim ** -0.5,
                "sliding_window": window, "logit_cap": 0.0}

    def run(self, config: DecodeConfig, inputs: dict[str, Any]) -> Any:  # type: ignore[override]
        return self.launch(config, **inputs)

    def reference(self, inputs: dict[str, Any]) -> Any:
        from kdispatch.kernels.decode_attention_ref import reference_decode_attention
        return reference_decode_attention(**inputs)

    def tolerance(self, key: DecodeKey) -> tuple[float, float]:  # type: ignore[override]
        # fp32: IEEE dots (input_precision="ieee"), only summation order differs: ~1e-6,
        #   2e-4 leaves room for exp2 vs exp and long reductions.
        # fp16: P is rounded to fp16 (2^-11) before the PV dot and the output is rounded
        #   once more: ~1e-3 worst case on O(1) outputs.
        # bf16: the same with an 8-bit mantissa (2^-8 per rounding): ~1e-2.
        return {"float32": (2e-4, 2e-4), "float16": (5e-3, 5e-3),
                "bfloat16": (2e-2, 2e-2)}[key.dtype]

    def bytes_moved(self, key: DecodeKey) -> int:  # type: ignore[override]
        kd = TORCH_DTYPES[key.kv_dtype].itemsize
        qd = TORCH_DTYPES[key.dtype].itemsize
        per_token = key.num_kv_heads * (key.head_dim if key.latent
                                        else key.head_dim + key.head_dim_v)
        kv = key.batch * key.context * per_token * kd
        return kv + key.batch * key.num_q_heads * (key.head_dim + key.head_dim_v) * qd


SPEC = DecodeSpec()
