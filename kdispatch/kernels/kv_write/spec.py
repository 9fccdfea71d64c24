"""Key, config, plain-form arguments, heuristic and validity of ``kv_write``."""

from __future__ import annotations

from typing import Any, Literal

import triton
from pydantic import Field, field_validator, model_validator

from kdispatch.dtypes import CACHE_DTYPES, CacheDType, DType, dtype_name, is_fp8
from kdispatch.kernels._common import pdl_capable
from kdispatch.opdef import OpConfig, OpKey, PlainArgs, check_pow2, ladder

MAX_TOKENS_BUCKET = 65536
Masking = Literal["none", "row_mask", "active_rows", "both"]
Variant = Literal["indexed", "fused"]

# Limits of a fused program's tile (elements per operand); above them registers spill.
MAX_TILE = 16384
MAX_ELEMS_PER_THREAD = 128
BLOCK_H_MAX = 64
BLOCK_T_MAX = 64

# Tile elements per operand (heads x padded head dim) a fused program copies, by token
# bucket. H200, 16x128 bf16, 96 graph-replayed writes (bench/results/nvidia-h200/
# kv_write.json sweep): T=1 best at 512 (4 heads: 1.110 us/write vs 1.230 at 2048);
# T=64 best at 2048 (16 heads: 2.156 vs 2.210 at 512); T=16384 within 1% for 1024-2048.
TILE_BY_TOKENS: tuple[tuple[int, int], ...] = ((1, 512), (MAX_TOKENS_BUCKET, 2048))
# Warps by tile elements per operand. Same sweep: 512-element tile best at 4 warps (1.110 vs
# 1.143 us at 2, 1.151 at 1); 2048 best at 4 for T=64 (2.156 vs 2.231 at 2), and 8 vs 4
# within 0.5% for the 16384-token write. Small tiles: no more warps than 16 B vectors.
WARPS_BY_TILE: tuple[tuple[int, int], ...] = ((128, 1), (256, 2), (2048, 4), (MAX_TILE, 8))
# Rows per program: 1. Same sweep: 2 or 4 rows never beat 1 (T=64: 2.160 vs 2.156 us;
# T=16384: 70.24 vs 69.46 us at 8 heads, 8 warps).
BLOCK_T_DEFAULT = 1
# fp8 caches (each value divided by its scale and rounded): elements per program of a
# decode step's write and warps by tile. H200 full-space tune (session 8): 8-64 tokens best
# at one head x 2-8 rows (16 x 128, 8 tokens: 1.1 us vs 1.8 at 16 heads x 1 row); one-token
# writes: QUANT_MIN_PER_THREAD.
QUANT_TILE = 256
#: up to this many tokens (a decode step); bulk fp8 writes keep the bf16 tiles (16,384
#: tokens: within 2% of the best)
QUANT_SMALL_TOKENS = 64
# Decode-step writes (2..64 tokens) over more than MANY_HEADS kv heads: MANY_HEADS_ROWS rows
# per program, tiles of MANY_HEADS_TILE elements per operand (fp8: below), warps by tile.
# H200 full-space tune on the session-11 kernels (55 heads x 96, the huginn preset): bf16 8
# tokens best at 2 heads x 4 rows (the 16-head x 1-row heuristic took 1.25x), 64 tokens
# within 2% of the best at 2 x 4 (16 x 1: 1.33x). At 8 and 16 heads the existing rules
# stay within 10% of the best (bench/results/nvidia-h200/session11/h200.sqlite).
MANY_HEADS = 16
MANY_HEADS_ROWS = 4
MANY_HEADS_TILE = 1024
# fp8 (session 25's tune of the division without a per-value divide, 55 x 96): 1 head x 4
# rows at 8 and 64 tokens, 4 warps at 8 tokens (0.996 us; 1 warp 1.102) and 1 warp at 64
# (1.507 us; 2 warps 1.899, session 11's 4 heads x 4 rows x 4 warps 1.928).
MANY_HEADS_FP8_TILE = 512
MANY_HEADS_FP8_WARPS_BY_TOKENS: tuple[tuple[int, int], ...] = ((8, 4), (QUANT_SMALL_TOKENS, 1))
QUANT_WARPS_BY_TILE: tuple[tuple[int, int], ...] = ((128, 1), (256, 2), (512, 4),
                                                     (MAX_TILE, 8))
# Fewest values a thread of an fp8 writer holds (bf16: 4, one 8-byte load). One-token fp8
# writes take QUANT_TILE values a program, this many a thread: H200 kv_write tune of every
# preset (session 25, bench/results/nvidia-h200/session25/h200.sqlite), one-token fp8 keys
# of head dims 64-256 best at 256 values over 4 warps (16 x 128: 2 heads, 0.845 us/write
# vs 0.880 at 4 heads x 4 warps; 8 x 256: 1 head, 0.863 vs 0.878); the 576-wide latent at
# 8 warps (4 a thread).
QUANT_MIN_PER_THREAD = 2


class KVWriteKey(OpKey):
    """Dispatch key of ``kv_write``: device fields plus dtypes, heads, dim, page, tokens,
    masking.

    ``dtype`` is the new rows' dtype, ``kv_dtype`` the cache's (``dtype`` itself, or fp8:
    the writer quantizes; a stored key without it is read as ``kv_dtype = dtype``).
    ``tokens`` is the bucketed row count (:func:`~kdispatch.buckets.pow2_bucket`, 1..65536);
    ``masking`` says which of ``row_mask`` / ``active_rows`` the call passes.
    """

    dtype: DType
    kv_dtype: CacheDType
    num_kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=1, le=1024)
    page_size: int = Field(ge=1, le=4096)
    tokens: int = Field(ge=1, le=MAX_TOKENS_BUCKET)
    masking: Masking = "none"

    @model_validator(mode="before")
    @classmethod
    def _cache_dtype_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kv_dtype" not in data and "dtype" in data:
            data = {**data, "kv_dtype": data["dtype"]}
        return data

    @model_validator(mode="after")
    def _cache_dtype(self) -> KVWriteKey:
        if self.kv_dtype != self.dtype and not is_fp8(self.kv_dtype):
            raise ValueError(f"kv_dtype {self.kv_dtype} must be dtype ({self.dtype}) or fp8")
        return self

    @field_validator("tokens")
    @classmethod
    def _tokens_bucket(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"tokens must be a power-of-two bucket, got {v}")
        return v


class KVWriteArgs(PlainArgs):
    """Plain-form arguments of ``kv_write`` (``resolve("kv_write", device=..., ...)``)."""

    tokens: int = Field(ge=1, le=1 << 30, description="Tokens written per call.")
    num_kv_heads: int = Field(ge=1, le=1024, description="KV heads.")
    head_dim: int = Field(ge=1, le=1024, description="Head dim.")
    page_size: int = Field(default=16, ge=1, le=4096, description="KV page size.")
    dtype: DType = Field(default="bfloat16", description="Dtype of the new K/V rows.")
    kv_dtype: CacheDType | None = Field(default=None,
                                        description="Cache dtype: dtype, or float8_e4m3fn / "
                                                    "float8_e4m3fnuz [default: dtype].")
    masking: Masking = Field(default="none",
                             description="Which of row_mask / active_rows the call passes.")

    @field_validator("kv_dtype", mode="before")
    @classmethod
    def _kv_alias(cls, v: Any) -> Any:
        return dtype_name(v, "kv_dtype", CACHE_DTYPES) if isinstance(v, str) else v


class KVWriteConfig(OpConfig):
    """Launch config of ``kv_write``.

    Attributes
    ----------
    variant : {"fused", "indexed"}
        ``fused``: one Triton launch for K and V. ``indexed``: two torch indexed
        assignments, the baseline the benchmarks compare with: it writes a negative slot
        into the cache's last slot and cannot mask rows, so it is never served from a
        table, a database row or an override (only an explicit launch runs it).
    block_h : int
        Heads per fused program (power of two, 1..64).
    block_t : int
        Token rows per fused program (power of two, 1..64).
    num_warps : int
        Warps per fused program.
    pdl : bool
        Launch the fused writer as a programmatic dependent launch (NVIDIA sm_90+ only).
    """

    variant: Variant = "fused"
    block_h: int = 1
    block_t: int = 1
    pdl: bool = False

    @field_validator("block_h")
    @classmethod
    def _block_h(cls, v: int) -> int:
        return check_pow2("block_h", v, 1, BLOCK_H_MAX)

    @field_validator("block_t")
    @classmethod
    def _block_t(cls, v: int) -> int:
        return check_pow2("block_t", v, 1, BLOCK_T_MAX)


def heuristic(key: KVWriteKey) -> KVWriteConfig:
    block_d = triton.next_power_of_2(key.head_dim)
    if (key.num_kv_heads > MANY_HEADS and 2 <= key.tokens <= QUANT_SMALL_TOKENS
            and block_d * MANY_HEADS_ROWS <= MANY_HEADS_TILE):
        # a decode step's tokens over many heads: programs of several rows and few heads
        block_t = min(key.tokens, MANY_HEADS_ROWS)
        fp8 = is_fp8(key.kv_dtype)
        tile = MANY_HEADS_FP8_TILE if fp8 else MANY_HEADS_TILE
        block_h = max(1, min(triton.next_power_of_2(key.num_kv_heads), BLOCK_H_MAX,
                             tile // (block_t * block_d)))
        warps = (ladder(MANY_HEADS_FP8_WARPS_BY_TOKENS, key.tokens) if fp8
                 else ladder(WARPS_BY_TILE, block_t * block_h * block_d))
        return KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                             num_warps=warps, pdl=pdl_capable(key))
    if is_fp8(key.kv_dtype) and key.tokens <= QUANT_SMALL_TOKENS:
        # quantizing (a division per value) a decode step's tokens wants small programs
        block_t = min(key.tokens, max(1, QUANT_TILE // block_d))
        block_h = 1 if key.tokens > 1 else min(max(1, QUANT_TILE // block_d),
                                               triton.next_power_of_2(key.num_kv_heads))
        tile = block_t * block_h * block_d
        # one row: its latency is a thread's chain of values, 2 each
        warps = (max(1, min(8, tile // (32 * QUANT_MIN_PER_THREAD))) if key.tokens == 1
                 else ladder(QUANT_WARPS_BY_TILE, tile))
        return KVWriteConfig(variant="fused", block_h=block_h, block_t=block_t,
                             num_warps=warps, pdl=pdl_capable(key))
    per_row = max(1, min(BLOCK_H_MAX, ladder(TILE_BY_TOKENS, key.tokens) // block_d))
    block_h = min(per_row, triton.next_power_of_2(key.num_kv_heads))
    tile = BLOCK_T_DEFAULT * block_h * block_d
    # pdl: back-to-back writes (one per layer) overlap their launch latency
    return KVWriteConfig(variant="fused", block_h=block_h, block_t=BLOCK_T_DEFAULT,
                         num_warps=ladder(WARPS_BY_TILE, tile), pdl=pdl_capable(key))


def is_valid(key: KVWriteKey, config: KVWriteConfig) -> bool:
    if config.variant == "indexed":
        # skipping rows by mask or active count would need a host sync: never allowed
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
    # more warps than the tile has 8-byte loads (4 values) only adds idle threads; an fp8
    # cache's values each take a division, so its threads may hold 2
    per_thread = QUANT_MIN_PER_THREAD if is_fp8(key.kv_dtype) else 4
    return config.num_warps == 1 or tile >= 32 * config.num_warps * per_thread
