"""Which decode keys the Gluon stage 1 tiles take (``kernel="gluon"``): the 64-row tile
(``gluon_mla``: its seesaw for bf16 latents, its work plan) and the narrow fp8 tile
(``gluon_mla_narrow``). Key predicates and constants only (``spec`` builds the configs)."""

from __future__ import annotations

from typing import Any

from kdispatch.kernels.decode_attention.gluon_mla_tiles import BLOCK_H, BLOCK_N
from kdispatch.kernels.decode_attention.work_plan import plan_items, plan_parts

#: the Gluon stage 1's shape: (head dim, v head dim), tokens per tile, rows per program;
#: the cache page sizes it takes (a 64-token tile is 64 // page pages, one TMA copy each)
GLUON_HEAD_DIMS = (576, 512)
GLUON_TILE_TOKENS = BLOCK_N
GLUON_PAGE_SIZES = (16, 32, 64)
GLUON_KV_DTYPES = ("bfloat16", "float8_e4m3fn")
GLUON_ROWS = BLOCK_H
#: fewer (token, head) rows a request than this pad a 64-row tile too much to be a choice
GLUON_MIN_ROWS = 16
#: the heuristic takes the Gluon tile from this many (token, head) rows per request: more
#: than one 16-row Triton tile. H200, session 12, b32 x 16,384, 64-token pages, Gluon /
#: Triton tile: 128 heads 338 / 590 us, 128 heads x 2 tokens 645 / 1172, 16 x 4 181 / 337,
#: 16 x 2 189 / 225 (16-token pages 204 / 226); the full-space tune of kimi-k3-tp8's two-
#: token keys (12 heads x 2 = 24 rows, 16-token pages): b1 x 65,536 42.0 / 52.3 us, b8 x
#: 393,216 1150 / 1261. 16 heads x 1 token (16 rows) keeps the Triton tile: 177 / 163.
#: fp8 latents the same (session 20, the same run, fp8 Gluon / best Triton tile timed:
#: 128 heads 487.7 / 683.1 us, 16 x 2 248.0 / 294.9; every such key of the re-tune has the
#: Gluon tile best or within 1.5% of it)
GLUON_HEURISTIC_MIN_ROWS = 17
#: the narrow fp8 tile's rows: a request's (token, head) rows fill one program of 16 (32
#: rows did not fit its shared memory with two V tiles; at one, 16 heads x 2 tokens ran
#: 1.01x the 64-row tile's time: docs/decode_notes.md v30)
NARROW_MAX_ROWS = 16


def _gluon_latent(key: Any) -> bool:
    """What both Gluon tiles need of ``key``: absorbed MLA with a 576/512 latent on 16-,
    32- or 64-token pages (64-token tiles), bf16 queries, no window, on an NVIDIA Hopper
    GPU (warpgroup MMA, TMA)."""
    return (key.latent and key.vendor == "nvidia" and key.arch == "sm_90"
            and key.head_dim == GLUON_HEAD_DIMS[0] and key.head_dim_v == GLUON_HEAD_DIMS[1]
            and key.page_size in GLUON_PAGE_SIZES and key.dtype == "bfloat16"
            and not key.sliding)


def gluon_fits(key: Any) -> bool:
    """Whether the Gluon stage 1 (``kernel="gluon"``) serves ``key``: the Gluon latent
    (:func:`_gluon_latent`) over a bf16 or float8_e4m3fn cache (fp8 converted to fp16 per
    tile), at least ``GLUON_MIN_ROWS`` (token, head) rows a request (its 64-row tiles
    padded past them)."""
    return (_gluon_latent(key) and key.kv_dtype in GLUON_KV_DTYPES
            and key.rows >= GLUON_MIN_ROWS)


def seesaw_key(key: Any) -> bool:
    """Whether the Gluon stage 1 runs ``key`` as its seesaw (a bf16 latent, at every page
    size it takes; ``gluon_mla.seesaw``)."""
    return gluon_fits(key) and key.kv_dtype == "bfloat16"


def narrow_fits(key: Any) -> bool:
    """Whether the narrow Gluon tile (``gluon_mla_narrow``: the tokens as the MMA's M, a
    request's rows its N) serves ``key``: the Gluon latent (:func:`_gluon_latent`) over an
    fp8 (e4m3) cache, at most ``NARROW_MAX_ROWS`` (token, head) rows a request."""
    return (_gluon_latent(key) and key.kv_dtype == "float8_e4m3fn"
            and key.rows <= NARROW_MAX_ROWS)


#: persistent programs per SM share the tuner tries with the work plan (1: one wave)
PLAN_SPLITS = (1, 2)


def plan_workspace_bytes(key: Any, splits: int) -> int:
    """The partials of a work plan (:mod:`work_plan`): ``plan_items`` slots a row."""
    rows = key.q_len * key.num_q_heads
    parts = plan_parts(splits, key.cu_count, rows)
    return plan_items(parts, key.batch) * rows * (key.head_dim_v + 1) * 4
