"""Key, config, plain-form arguments, heuristic and validity of ``decode_attention``.

The key is built from shapes, dtypes and the device only. The context field is the
*capacity* ``block_table.shape[1] * page_size`` (or the sliding window when smaller),
bucketed with :func:`~kdispatch.buckets.half_pow2_bucket`; ``seq_lens`` values are never
read, so a config resolved at CUDA-graph capture holds at every replay. ``kv_dtype`` is
the cache's dtype (q's, or fp8) and ``q_len`` the new tokens per request (q's dim 1 for
a 4-D q: speculative decoding, multi-token prediction), both host-known and graph-stable."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from kdispatch.dtypes import CACHE_DTYPES, CacheDType, DType, dtype_name, is_fp8, itemsize
from kdispatch.kernels._common import pdl_capable
# the Gluon tiles' keys (re-exported: spec is where a key's tiles are looked up)
from kdispatch.kernels.decode_attention.gluon_keys import (  # noqa: F401
    GLUON_HEAD_DIMS, GLUON_HEURISTIC_MIN_ROWS, GLUON_KV_DTYPES, GLUON_MIN_ROWS,
    GLUON_PAGE_SIZES, GLUON_ROWS, GLUON_TILE_TOKENS, NARROW_MAX_ROWS, PLAN_SPLITS, gluon_fits,
    narrow_fits, plan_workspace_bytes, seesaw_key)
from kdispatch.opdef import OpConfig, OpKey, PlainArgs, check_pow2, ladder

MAX_SPLITS = 256
#: new query tokens per request a key may carry (speculative decoding, MTP)
MAX_Q_LEN = 8
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
#: (bf16 tiles of one program per SM fill whole waves of one instead: SMEM_PER_SM)
GQA_PROGRAMS_PER_SM = 2
#: minimum BLOCK_N tiles per split, by context bucket: a split's fixed cost is about one
#: to two tiles (q load, partial store, reduce read), so <4 tiles wastes most of it. H200
#: full-space tune (session 8, 128-token tiles): batch 1 x 4k-8k best at 4 tiles per split
#: (ouro 8 splits, llama 16), batch 1 x 32k at 16 (16 splits: 39.0 us vs 44.5 at 33).
MIN_TILES_PER_SPLIT: tuple[tuple[int, int], ...] = (
    (8192, 4),        # short contexts: latency dominates, split finely to fill the device
    (1 << 30, 16),    # long contexts: fewer, longer splits amortize the per-split cost
)
#: the same for tiles of half the bytes (fp8 caches; bf16 rows of at most
#: FINE_SPLIT_MAX_ROW_BYTES): long contexts split twice as finely (session 12: fp8 b1 x 32k
#: 21 vs 26 us at 32 vs 16 splits at D=64, 30 vs 37 at D=128; bf16 D=64 b1 x 32k 24.0 vs
#: 24.9 us at 32 vs 16 splits, and 24.2-24.9 vs 26.0-27.9 in sessions 14, 18, 20 and 21)
MIN_TILES_PER_SPLIT_FP8: tuple[tuple[int, int], ...] = ((8192, 4), (1 << 30, 8))
#: a K row of at most this many bytes (bf16 or fp16 at head dim 64) takes the finer ladder
FINE_SPLIT_MAX_ROW_BYTES = 128
#: Absorbed MLA (latent keys) fills whole waves of resident programs instead: programs
#: = floor(slots / base) * base, slots = SMs x resident programs per SM (2 for the 32-token
#: 12-16-head tile, 1 for 64-head blocks). H200 v3 (docs/decode_notes.md): deepseek TP8
#: b32 x 16k at 8 splits (256 programs) 171 us vs 235 us at ceil's 9 (288: a 24-program
#: tail wave); TP1 128 heads best at 2 splits (128 programs at 1 per SM).
LATENT_PROGRAMS_PER_SM = 2
LATENT_PROGRAMS_PER_SM_WIDE = 1
#: ... unless each of two waves' splits still reads this many tokens: then the wide tile
#: takes two waves (the balanced grid since session 17 gives long requests more programs,
#: so a second wave balances instead of idling). H200 session 18 tune (first 24 candidates
#: of every preset key, bench/results/nvidia-h200/session18/h200.sqlite): 16 heads x 2
#: tokens b32 x 393,216 at 8 splits 4,312 us vs 4,864 at the one wave's 4; 128 heads b32 x
#: 65,536 at 4 splits 1,248 vs 1,348 at 2; fp8 128 heads x 2 tokens b32 x 32,768 2 splits
#: (merged) 2,716 vs 2,962 at 1; below it one wave stays best (b8 x 16,384 x 2 tokens: 16
#: splits, 1.14x slower at 32; 128 heads b32 x 8,192: 2 splits, 1.06x slower at 4).
LATENT_WIDE_TWO_WAVES_MIN_TOKENS = 8192
#: ... and when the one wave already gives each request at least this many splits (session
#: 22's tune, the Gluon tile with its copy warp: 128 heads b32 x 32,768 / 65,536 best at
#: the one wave's 2 splits, the two waves' 4 at 1.017-1.037x their time, bf16 and fp8; 16
#: heads x 2 tokens b32 x 393,216 (one wave: 4) and 12-16 heads x 2 tokens b8 x 393,216
#: (16) keep their two waves: within 1% of the one wave at b32, 0.93-1.03x at b8)
LATENT_WIDE_TWO_WAVES_MIN_SPLITS = 4
#: ... but 2 for the Gluon tile's seesaw (bf16 latents; measured in 64-token pages, session
#: 23, taken at every page size the seesaw serves): its tune has 128 heads b32 x 32,768 /
#: 65,536 best at the two waves' 4 splits, the one wave's 2 at 1.024x / 1.031x their time
#: (b32 x 16,384 keeps one wave: 4,096 tokens a split)
SEESAW_TWO_WAVES_MIN_SPLITS = 2
#: ... and at contexts of at least this many tokens it splits at least in two (merged by
#: the last program where the tile merges), unless its grid is this many waves unsplit:
#: the second split evens out the last wave of a large batch (same tune: 128 heads b128 x
#: 16,384 at 2 splits 1,337 vs 1,413 us unsplit (bf16, Gluon; 3 splits 1,329); fp8 x 2
#: tokens b128 x 65,536 at 2 splits merged 21,361 vs 23,509 unsplit, a 3.9-wave grid).
#: bf16 only since session 22's tune (the Gluon tile with its copy warp): fp8 latents run
#: unsplit there within 2% of the best at every 128-head key, and 1.01-1.05x faster than
#: 2 splits at two tokens b32 (8,192-65,536) and b128 x 65,536.
LATENT_WIDE_MIN_SPLIT_CONTEXT = 8192
LATENT_WIDE_MIN_SPLIT_MAX_WAVES = 4
#: ... from 16k tokens on for the seesaw (session 23's tune, 128 heads in 64-token pages:
#: at 8,192 tokens unsplit 0.95x the time of 2 splits at two tokens b32, 0.99x at one
#: token b128, 1.002x at two tokens b128; at 16,384 2 splits best at every b32 and b128
#: key, one token and two)
SEESAW_MIN_SPLIT_CONTEXT = 16384
#: minimum tokens per split for latent keys: kimi b1 x 65,536 at 132 splits (15.5 tiles
#: of 32) 39.6 us vs 44.8 us at 264 (7.8 tiles), H200 v3; in tokens, not tiles, since the
#: session 9 tune: the fp8 two-token 64-token tile there is best at 128 splits (8 tiles,
#: 53.8 us) and took 84.8 us at the 64 that 16 tiles allowed
LATENT_MIN_TOKENS_PER_SPLIT = 512
#: GQA/MHA tiles ``(fp8 cache, up to padded head dim, (block_n, num_stages))``, the first
#: match applies. H200 full-space tunes: D<=128 best at 128 tokens and 3 stages at every
#: preset key, bf16 and fp8 (session 8: bf16 b4 x 262k 952 vs 965 us at 64; fp8 640 vs 941
#: us; D=96 too). D=256 (session 12, gemma2-9b): bf16 at 128 tokens and 2 stages (the same
#: shared memory as 64 at 3) at every key, 1.22-1.30x faster than 64 at 3 (b8 x 32k 508 vs
#: 653 us); fp8 at 64 tokens and 3 stages (its converted tile makes 128 at 2 larger). The
#: 576-wide MLA tile is fastest at 32 tokens (kimi b8 x 327,600: 951 vs 1366 us at 64).
GQA_TILES: tuple[tuple[bool, int, tuple[int, int]], ...] = (
    (False, 128, (128, 3)),
    (False, 256, (128, 2)),
    (True, 128, (128, 3)),
    (True, 256, (64, 3)),
    (False, 1 << 20, (32, 3)),
    (True, 1 << 20, (32, 3)),
)
#: bf16 head dims up to this take 2 stages when the grid is not split (many resident
#: programs): session 12, llama3.2-1b (D=64) b64 x 8k/32k 250/978 vs 304/1197 us at 3
#: (D=128 keeps 3 there: 493 us, its 2-stage tiles no faster)
GQA_TWO_STAGES_UNSPLIT_DIM = 64
#: fp8 GQA tiles of at most this many bytes of shared memory (two or more resident per
#: SM) fill the device with twice GQA_PROGRAMS_PER_SM programs: session 12, D=64 fp8 b8 x
#: 32k 95 us at 8 splits vs 113 at 4, b4 x 262k 378 vs 431 at 16 vs 8, b8 x 8k 30 vs 34 at
#: 8 vs 4 (D=128 fp8 tiles, 128 KB, one per SM, keep GQA_PROGRAMS_PER_SM)
FP8_DENSE_SMEM = 96 * 1024
#: shared memory of one SM (Hopper: 228 KB). A bf16 GQA tile of more than half of it runs
#: one program per SM (sm_90a compiles, tools/compile_check.py: D=128 at 128 tokens x 3
#: stages 140,288 B, D=256 at 128 x 2 143,872 B; D=64 at 128 x 3 72,704 B, three per SM),
#: so its split count fills whole waves of one program per SM, as the latent rule does: H200
#: session 14 (bench/results/nvidia-h200/session14/h200.sqlite), D=128 b1 x 131k 131.0 us
#: at 16 splits (128 programs) vs 135.6 at 33 and 175.8 at 17; b8 x 8k 70.0 at 2 vs 73.4 at
#: 4; b8 ouro (16 heads) x 4k 66.7 unsplit vs 71.7 at 2; D=256 b8 x 32k 515.6 at 2 vs 516.7
#: at 4. (fp8 tiles keep GQA_PROGRAMS_PER_SM: :func:`smem_bytes` counts a converted tile the
#: compiler does not keep, D=128 fp8 128 x 3 compiles to 107,520 B, two per SM)
SMEM_PER_SM = 228 * 1024
#: a one-program-per-SM tile whose whole waves keep fewer than this share of the SMs busy
#: (a request x head grid that does not tile the SMs) drops to 2 stages, several programs
#: per SM: session 14 (as sessions 11 and 12), 55 heads x 96 b1 x 4k: 32.6 us at 5 splits,
#: 2 stages vs 35.1 at 2 splits, 3 stages (110 of 132 SMs busy) and 37.4 at 5, 3 stages
ONE_PER_SM_MIN_FILL = 7 / 8
#: GQA/MHA split grids whose cache read is at most this many bytes per SM launch the reduce
#: early (pdl): it saves 1-2 us of the reduce's launch, 2-11% of such short calls. Session
#: 14, the heuristic's pdl twin at every key of <= 64 MiB on 132 SMs: 0.889-0.980 of the
#: heuristic (D=128 b1 x 8k 14.4 vs 16.1 us); above it 0.974-1.036 (bf16 0.97-1.00; fp8
#: D=256 b8 x 32k 368.7 vs 356.0 us, D=128 b4 x 262k 656.5 vs 644.4). Raised from 512 KiB
#: in session 21: the six preset keys of 640-993 KiB per SM, timed both ways in sessions
#: 18, 20 and 21 (the twin of each heuristic config is a candidate), ran 0.964-0.978 with
#: the early reduce at the three bf16 ones (55 x 96 b1 x 4k 31.2-31.5 vs 32.2-32.4 us, D=64
#: b8 x 8k 38.4-39.3 vs 39.7-40.2, D=128 b1 x 32k 37.7-38.5 vs 38.8-39.5), 0.990-1.001 at
#: the fp8 D=128 ones and 0.998-1.005 at fp8 D=256 b1 x 32k. The next keys up (about 2
#: MiB per SM) split: bf16 faster with it, fp8 1.5-2.4% slower (D=256 b8 x 8k, D=128 b1 x
#: 131k)
GQA_PDL_MAX_BYTES_PER_SM = 1024 * 1024
#: Latent (MLA) tiles ``(fp8 cache, up to rows, (block_n, num_warps, num_stages))``, the
#: first match applies. Timed on the H200: bf16 16 rows at 32 tokens, 4 warps, 3 stages
#: (v2: kimi b8 x 327,600 830 vs 993 us at 2 stages; 64 tokens 1366 us); 64 rows (128
#: heads) at 64 tokens, 8 warps, 2 stages (v1: 848 vs 1174 us at 32 tokens). Session 8's
#: full-space tune (v8): bf16 32 rows (two tokens x 16 heads) best at 32 tokens, 4 warps,
#: 3 stages at every two-token key (1.37-1.63x faster than 16 tokens, though ptxas
#: reports 68 bytes of spills); fp8 16 rows as bf16 (211 registers, no spills); fp8 32
#: rows at 64 tokens, 8 warps, 2 stages (1.9-2.5x faster than 16 tokens at 3). Session 9
#: (128 heads): fp8 64-row blocks best at that tile too, as bf16 ones.
#: BLOCK_N of wide (>= 64-row) GQA blocks, as for MLA (H200 v1, 128 heads).
BLOCK_N_WIDE_HEADS = 64
LATENT_TILES: tuple[tuple[bool, int, tuple[int, int, int]], ...] = (
    (False, 16, (32, 4, 3)),
    (False, 32, (32, 4, 3)),
    (False, 1 << 20, (64, 8, 2)),
    (True, 16, (32, 4, 3)),
    (True, 1 << 20, (64, 8, 2)),
)
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


def p2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DecodeKey(OpKey):
    """Dispatch key of ``decode_attention`` (device fields + shapes, bucketed)."""

    dtype: DType
    kv_dtype: CacheDType
    num_q_heads: int = Field(ge=1, le=4096)
    num_kv_heads: int = Field(ge=1, le=4096)
    head_dim: int = Field(ge=1, le=1024)
    head_dim_v: int = Field(ge=1, le=1024)
    page_size: int = Field(ge=1, le=4096)
    batch: int = Field(ge=1, le=1 << 20)
    context: int = Field(ge=1, le=1 << 30)
    sliding: bool = False
    batch_invariant: bool = False
    q_len: int = Field(default=1, ge=1, le=MAX_Q_LEN)

    @model_validator(mode="after")
    def _check(self) -> DecodeKey:
        if self.kv_dtype != self.dtype and not is_fp8(self.kv_dtype):
            raise ValueError(f"kv_dtype {self.kv_dtype} must be dtype ({self.dtype}) or fp8")
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
    def rows(self) -> int:
        """Rows of one kv head's tile: (new token, q head) pairs."""
        return self.q_len * self.group

    @property
    def latent(self) -> bool:
        """Absorbed-MLA shape: one kv head whose V is the first head_dim_v K columns."""
        return self.num_kv_heads == 1 and self.head_dim_v < self.head_dim


class DecodeArgs(PlainArgs):
    """Plain-form arguments of ``decode_attention`` (``resolve(op, device=..., ...)``)."""

    batch: int = Field(ge=1, le=1 << 20, description="Decode batch size.")
    context: int = Field(ge=1, le=1 << 30,
                         description="Context capacity (tokens) per request: block-table "
                                     "width x page size.")
    num_q_heads: int = Field(ge=1, le=4096, description="Query heads.")
    num_kv_heads: int = Field(ge=1, le=4096, description="KV heads (1 for MLA).")
    head_dim: int = Field(ge=1, le=1024, description="Q/K head dim (576 for MLA).")
    head_dim_v: int | None = Field(default=None, ge=1, le=1024,
                                   description="V head dim (512 for MLA) [default: head dim].")
    page_size: int = Field(default=16, ge=1, le=4096, description="KV page size.")
    dtype: DType = Field(default="bfloat16", description="Query dtype.")
    kv_dtype: CacheDType | None = Field(default=None,
                                        description="Cache dtype: dtype, or float8_e4m3fn / "
                                                    "float8_e4m3fnuz [default: dtype].")
    q_len: int = Field(default=1, ge=1, le=MAX_Q_LEN,
                       description="New query tokens per request (speculative decoding).")
    sliding_window: int | None = Field(default=None, ge=1,
                                       description="Attend to the last N tokens only.")
    batch_invariant: bool = Field(default=False,
                                  description="Split count independent of the batch size.")

    @field_validator("kv_dtype", mode="before")
    @classmethod
    def _kv_alias(cls, v: Any) -> Any:
        return dtype_name(v, "kv_dtype", CACHE_DTYPES) if isinstance(v, str) else v


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
    #: the stage-1 kernel: ``"triton"``, or ``"gluon"`` (Hopper's warpgroup MMA and TMA page
    #: copies, for the 64-row MLA tiles that :func:`gluon_fits` names)
    kernel: Literal["triton", "gluon"] = "triton"
    #: the Gluon stage 1 only: a work plan computed on the device from the lengths cuts
    #: the batch's tiles into equal parts, one persistent program each, ``num_kv_splits``
    #: per SM share (work_plan.py)
    plan: bool = False

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """``kernel`` and ``plan`` are left out at their defaults, so a config serializes
        (and its stored digest stays) as before those fields existed."""
        data = handler(self)
        if data.get("kernel") == "triton":
            del data["kernel"]
        if not data.get("plan", True):
            del data["plan"]
        return data

    @field_validator("block_n")
    @classmethod
    def _block_n(cls, v: int) -> int:
        return check_pow2("block_n", v, 16, 256)

    @field_validator("block_h")
    @classmethod
    def _block_h(cls, v: int) -> int:
        return check_pow2("block_h", v, 16, 128)


def workspace_bytes(key: DecodeKey, splits: int) -> int:
    if splits == 1:
        return 0
    rows = INVARIANT_NOMINAL_BATCH if key.batch_invariant else key.batch
    return rows * key.q_len * key.num_q_heads * splits * (key.head_dim_v + 1) * 4


def max_splits_for_budget(key: DecodeKey) -> int:
    rows = INVARIANT_NOMINAL_BATCH if key.batch_invariant else key.batch
    per_split = rows * key.q_len * key.num_q_heads * (key.head_dim_v + 1) * 4
    return max(1, min(MAX_SPLITS, WORKSPACE_BUDGET // per_split))


#: a balanced split grid holds up to this many times the config's split count (H200 session
#: 16, ragged lengths N(context/2, context/4): 2x gained as much as 4x, and its empty
#: programs cost less at full context)
BALANCE_HEADROOM = 2


def grid_splits(splits: int, batch: int, rows: int, dv: int, table_tokens: int,
                block_n: int, base: int = 0, per_sm: int = 1, cu_count: int = 0) -> int:
    """The split axis of a balanced grid for ``splits`` configured splits: ``splits`` times
    the headroom, at most :data:`MAX_SPLITS`, one split per ``block_n`` tokens of the
    table's width, and a workspace of ``batch x rows`` partial rows of ``dv`` columns within
    :data:`WORKSPACE_BUDGET`; never fewer than ``splits``.

    With ``base`` programs per split, ``per_sm`` resident per SM and ``cu_count`` SMs: a
    config whose busy programs fit one wave with slots to spare keeps its grid within the
    resident slots when a grid past them would crowd the busy programs onto too few SMs.
    H200 session 17, head dim 64 (three programs per SM), b8 x 32k at 4 splits (256 busy
    programs, 396 slots): 8 grid splits (512 programs) 1.08-1.10x the time of 4, while 5
    and 6 cost nothing (call 6); there the GPU packed the busy programs three to an SM."""
    per_split = batch * rows * (dv + 1) * 4
    g = min(BALANCE_HEADROOM * splits, MAX_SPLITS, -(-table_tokens // block_n),
            WORKSPACE_BUDGET // per_split)
    if base and cu_count and per_sm > 1:
        busy, slots = splits * base, per_sm * cu_count
        packed = -(-busy // per_sm)  # SMs the busy programs take when packed per_sm deep
        if busy < slots < g * base and packed < 0.95 * min(busy, cu_count):
            g = min(g, slots // base)
    return max(splits, g)


def resident_per_sm(smem: int) -> int:
    """Programs of a tile that fit one SM's shared memory (at least one)."""
    return max(1, SMEM_PER_SM // max(1, smem))


def tile_smem(kv_size: int, q_size: int, dk: int, dv: int, latent: bool, fp8: bool,
              block_n: int, block_h: int, num_stages: int) -> int:
    """:func:`smem_bytes` from raw sizes (bytes per cache and q element, head dims)."""
    dpe = dk - dv
    dv = max(16, p2(dv))
    dpe = max(16, p2(dpe)) if dpe else 0
    cols = dv + dpe + (0 if latent else dv)
    converted = block_n * cols * q_size if fp8 else 0
    return (max(1, num_stages - 1) * block_n * cols * kv_size + converted
            + block_h * (dv + dpe) * q_size)


def smem_bytes(key: DecodeKey, cfg: DecodeConfig) -> int:
    """Shared memory of the pipelined K/V tiles and the q block (an estimate). An fp8 tile
    is pipelined as fp8, plus one tile converted to q's dtype for the dots."""
    return tile_smem(itemsize(key.kv_dtype), itemsize(key.dtype), key.head_dim,
                     key.head_dim_v, key.latent, is_fp8(key.kv_dtype), cfg.block_n,
                     cfg.block_h, cfg.num_stages)


def default_block_h(key: DecodeKey) -> int:
    """All rows of a kv head (tokens x heads) in one block up to 64 rows: MLA with several
    query tokens reads each latent tile once for all of them. fp8 latents too since the
    fp8 tiles are converted after row-vectorized loads (H200 session 9 tune, 128 heads:
    64-row fp8 blocks 1.6x faster than 32-row ones at every deepseek-v3-dp key)."""
    rows = key.rows
    if rows <= 16:
        return 16
    return min(64, p2(rows))  # aiter bh64-style regime for wide MLA (128 heads: 2 blocks)


def latent_tile(key: DecodeKey, block_h: int) -> tuple[int, int, int]:
    """``(block_n, num_warps, num_stages)`` of a latent (MLA) block of ``block_h`` rows."""
    for fp8, rows, tile in LATENT_TILES:
        if fp8 == is_fp8(key.kv_dtype) and block_h <= rows:
            return tile
    return LATENT_TILES[-1][2]


def gqa_tile(key: DecodeKey) -> tuple[int, int]:
    """``(block_n, num_stages)`` of a GQA/MHA (non-latent) key's 16-row block."""
    fp8, dim = is_fp8(key.kv_dtype), p2(key.head_dim)
    return next(tile for f, d, tile in GQA_TILES if f == fp8 and dim <= d)


def dense_fp8(key: DecodeKey, block_n: int) -> bool:
    """An fp8 GQA tile small enough for two or more resident programs per SM (3 stages)."""
    if not is_fp8(key.kv_dtype) or key.latent:
        return False
    cfg = DecodeConfig(block_n=block_n, block_h=16, num_stages=3)
    return smem_bytes(key, cfg) <= FP8_DENSE_SMEM


def one_per_sm(key: DecodeKey, block_n: int, num_stages: int) -> bool:
    """A bf16 (non-fp8) GQA tile that takes more than half of an SM's shared memory."""
    if is_fp8(key.kv_dtype) or key.latent:
        return False
    cfg = DecodeConfig(block_n=block_n, block_h=16, num_stages=num_stages)
    return smem_bytes(key, cfg) > SMEM_PER_SM // 2


def cache_bytes(key: DecodeKey) -> int:
    """Bytes of K and V cache the key's call reads (every request at full capacity)."""
    per_token = key.num_kv_heads * (key.head_dim + key.head_dim_v) * itemsize(key.kv_dtype)
    return key.batch * key.context * per_token


def merges(key: DecodeKey, splits: int) -> bool:
    """Whether a grid of ``splits`` merges in its last stage-1 program (no reduce kernel).

    NVIDIA only, where it was measured; elsewhere the merge stays a tuning candidate (the
    tuner verifies it before timing it) until a device of that vendor has measured it."""
    return key.vendor == "nvidia" and key.latent and 1 < splits <= MERGE_MAX_SPLITS_LATENT


def base_programs(key: DecodeKey, block_h: int) -> int:
    """Programs of one split: requests x kv heads x row blocks (batch 1 for batch_invariant
    keys, so a split count depends on shapes only)."""
    return key.batch * key.num_kv_heads * cdiv(key.rows, block_h)


def split_count(key: DecodeKey, block_h: int, block_n: int, num_warps: int = 4,
                num_stages: int = 3) -> int:
    base = base_programs(key, block_h)
    # resident programs per SM: one 8-warp latent block (>= 162 registers per thread at
    # every latent tile compiled), two 4-warp blocks
    wide = key.latent and (block_h >= 64 or num_warps >= 8)
    least = 1
    seesaw = seesaw_key(key)
    min_split = SEESAW_MIN_SPLIT_CONTEXT if seesaw else LATENT_WIDE_MIN_SPLIT_CONTEXT
    if (wide and not is_fp8(key.kv_dtype) and key.context >= min_split
            and base < LATENT_WIDE_MIN_SPLIT_MAX_WAVES * key.cu_count):
        least = 2
    if not key.batch_invariant and base >= SPLIT_OFF_WAVES * key.cu_count:
        return max(1, min(least, max_splits_for_budget(key)))
    if key.latent:
        per_sm = LATENT_PROGRAMS_PER_SM_WIDE if wide else LATENT_PROGRAMS_PER_SM
        splits = max(least, per_sm * key.cu_count // base)
        two_waves = max(1, 2 * per_sm * key.cu_count // base)
        least_two = (SEESAW_TWO_WAVES_MIN_SPLITS if seesaw
                     else LATENT_WIDE_TWO_WAVES_MIN_SPLITS)
        if (wide and two_waves > splits >= least_two
                and key.context // two_waves >= LATENT_WIDE_TWO_WAVES_MIN_TOKENS):
            splits = two_waves
        min_tokens = LATENT_MIN_TOKENS_PER_SPLIT
    else:
        fine = (is_fp8(key.kv_dtype)
                or itemsize(key.kv_dtype) * p2(key.head_dim) <= FINE_SPLIT_MAX_ROW_BYTES)
        tiles = ladder(MIN_TILES_PER_SPLIT_FP8 if fine else MIN_TILES_PER_SPLIT, key.context)
        if one_per_sm(key, block_n, num_stages):
            splits = max(1, key.cu_count // base)  # whole waves: no partial wave
        else:
            per_sm = GQA_PROGRAMS_PER_SM * (2 if dense_fp8(key, block_n) else 1)
            splits = max(1, round(per_sm * key.cu_count / base))
        min_tokens = tiles * block_n
    splits = min(splits, max(1, key.context // min_tokens), max_splits_for_budget(key))
    return max(1, splits)


def narrow_splits(key: DecodeKey) -> int:
    """The narrow fp8 tile's split count: whole waves of one program per SM, two where a
    split of two waves still holds ``NARROW_TWO_WAVES_MIN_TOKENS`` and two waves fit in
    ``MAX_SPLITS``, at most one split per ``LATENT_MIN_TOKENS_PER_SPLIT``."""
    base = base_programs(key, 16)
    one, two = max(1, key.cu_count // base), max(1, 2 * key.cu_count // base)
    splits = two if two <= MAX_SPLITS and key.context // two >= NARROW_TWO_WAVES_MIN_TOKENS \
        else one
    return max(1, min(splits, key.context // LATENT_MIN_TOKENS_PER_SPLIT, MAX_SPLITS,
                      max_splits_for_budget(key)))


def heuristic(key: DecodeKey) -> DecodeConfig:
    block_h = default_block_h(key)
    if narrow_fits(key):  # (session 30's tune: best at 7 of 8 such keys, 1.007-1.217x)
        cfg = narrow_config(narrow_splits(key), key.rows)
        if is_valid(key, cfg):
            return cfg
    if gluon_fits(key) and key.rows >= GLUON_HEURISTIC_MIN_ROWS:
        splits = split_count(key, GLUON_ROWS, GLUON_TILE_TOKENS, 8)
        # fp8 latents filling the tile at one split: the plan (best at all 12, session 29)
        fp8_plan = splits == 1 and is_fp8(key.kv_dtype) and key.rows >= GLUON_ROWS
        for plan in (True, False) if fp8_plan else (False,):  # (the split grid once)
            if is_valid(key, cfg := gluon_config(splits, plan)):
                return cfg
    if key.latent:
        block_n, warps, stages = latent_tile(key, block_h)
        splits = split_count(key, block_h, block_n, warps)
    else:
        # fp8 caches take the bf16 tile (H200 full-space tune, session 8: 128 tokens at
        # 3 stages best for both at every preset key, split or not)
        block_n, stages = gqa_tile(key)
        if block_h >= 64:
            block_n = BLOCK_N_WIDE_HEADS
        warps = 8 if block_h >= 64 else 4
        splits = split_count(key, block_h, block_n, warps, stages)
        base = base_programs(key, block_h)
        if (splits > 1 and stages > 2 and one_per_sm(key, block_n, stages)
                and key.cu_count // base * base < ONE_PER_SM_MIN_FILL * key.cu_count):
            stages = 2  # the grid does not tile the SMs: several smaller programs per SM
            splits = split_count(key, block_h, block_n, warps, stages)
        if (splits == 1 and not is_fp8(key.kv_dtype)
                and p2(key.head_dim) <= GQA_TWO_STAGES_UNSPLIT_DIM):
            stages = 2
    # pdl: MLA keeps it off (9-15% slower at batch 1 with 128-256 splits: session 4d,
    # decode-pdl.json); GQA/MHA takes it for short calls (GQA_PDL_MAX_BYTES_PER_SM)
    pdl = (not key.latent and splits > 1 and pdl_capable(key)
           and cache_bytes(key) <= GQA_PDL_MAX_BYTES_PER_SM * key.cu_count)
    cfg = DecodeConfig(num_kv_splits=splits, block_n=block_n, block_h=block_h,
                       num_warps=warps, num_stages=stages, pdl=pdl, merge=merges(key, splits))
    while not is_valid(key, cfg) and cfg.block_n > 16:
        cfg = cfg.model_copy(update={"block_n": cfg.block_n // 2})
    return cfg


def baseline(key: DecodeKey) -> DecodeConfig:
    """The heuristic's tile at split count 1 (what the benchmarks call the baseline)."""
    return heuristic(key).model_copy(update={"num_kv_splits": 1, "pdl": False, "merge": False})


def gluon_config(splits: int, plan: bool = False) -> DecodeConfig:
    """The Gluon stage 1's config at ``splits`` (its tile is fixed: 64 rows, 64 tokens),
    with the device-side work plan when ``plan``."""
    return DecodeConfig(kernel="gluon", num_kv_splits=splits, block_n=GLUON_TILE_TOKENS,
                        block_h=GLUON_ROWS, num_warps=8, num_stages=2, plan=plan)


#: the narrow fp8 tile's warps (one warpgroup) and stages (its TMA ring: two, beside two
#: fp16 V tiles)
NARROW_WARPS = 4
NARROW_STAGES = 2
#: two waves of the narrow tile where each split keeps this many tokens (session 31's tune,
#: fp16 scores, best split counts: b8 x 65,536 33 (17: 1.43x slower), b8 x 393,216 33, b32
#: x 393,216 8; one wave: b8 x 16,384 16, b1 x 65,536 128 and b1 x 393,216 132 (two waves
#: there pass MAX_SPLITS: 256 took 1.14x as long); b32 x 16,384 goes either way (8 in the
#: tune, 4 3% faster in call 2's check))
NARROW_TWO_WAVES_MIN_TOKENS = 1024


def narrow_config(splits: int, rows: int) -> DecodeConfig:
    """The narrow fp8 Gluon tile's config at ``splits`` for ``rows`` (token, head) rows a
    request (``gluon_mla_narrow``: 64-token tiles, 16 rows a program; past 16 rows a
    32-row config no key takes, so ``gluon_call`` turns a 16-row one away from wider calls)."""
    return DecodeConfig(kernel="gluon", num_kv_splits=splits, block_n=GLUON_TILE_TOKENS,
                        block_h=16 if rows <= 16 else 32, num_warps=NARROW_WARPS,
                        num_stages=NARROW_STAGES)


def is_valid(key: DecodeKey, config: DecodeConfig) -> bool:
    if config.kernel == "gluon" and config.block_h < GLUON_ROWS:  # the narrow fp8 tile
        return (narrow_fits(key) and config == narrow_config(config.num_kv_splits, key.rows)
                and workspace_bytes(key, config.num_kv_splits) <= WORKSPACE_BUDGET)
    if config.kernel == "gluon" or config.plan:  # the plan: the Gluon tile's alone, and its
        # items depend on the batch's lengths (never batch invariant)
        ws = (plan_workspace_bytes if config.plan else workspace_bytes)(key,
                                                                        config.num_kv_splits)
        return (gluon_fits(key) and config == gluon_config(config.num_kv_splits, config.plan)
                and not (config.plan and key.batch_invariant) and ws <= WORKSPACE_BUDGET)
    if config.block_h > max(16, p2(key.rows)):
        return False
    if config.pdl and (config.num_kv_splits == 1 or not pdl_capable(key)):
        return False  # no reduce to launch early / no griddepcontrol on the device
    if config.merge and (config.num_kv_splits == 1 or config.pdl):
        return False  # nothing to merge / no reduce kernel to launch early
    if workspace_bytes(key, config.num_kv_splits) > WORKSPACE_BUDGET:
        return False
    if key.vendor != "triton":  # GPU resource limits (the interpreter has none)
        if smem_bytes(key, config) > SMEM_LIMIT:
            return False
        acc = config.block_h * max(16, p2(key.head_dim_v)) / (config.num_warps * 32)
        if acc > ACC_REGS_LIMIT:
            return False
    return True
