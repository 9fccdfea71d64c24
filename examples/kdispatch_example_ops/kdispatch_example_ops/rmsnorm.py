"""RMSNorm with ``@kdispatch.dispatch``: the config comes from tables, never from timing.

Compared with ``triton.autotune(configs=..., key=["n_cols"])``: the same configs and key,
plus a bucket for the key (one table row serves every width up to the next power of two),
a heuristic for keys nobody tuned, and the tuning face (random inputs, an fp32 reference,
the outputs to verify) that ``kdispatch tune --op example.rmsnorm`` uses offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

import kdispatch
from kdispatch.buckets import pow2_bucket

TABLES = Path(__file__).resolve().parent / "tables"
CONFIGS = [kdispatch.Config({"BLOCK": b}, num_warps=w)
           for b in (256, 1024, 4096) for w in (1, 4, 8)]


def _heuristic(key: dict[str, Any]) -> kdispatch.Config:
    """One program covers a row: the smallest block that holds it, 4 warps from 1024 on."""
    block = max(256, min(4096, triton.next_power_of_2(key["n_cols"])))
    return kdispatch.Config({"BLOCK": block}, num_warps=4 if block >= 1024 else 1)


def _inputs(key: dict[str, Any], device: Any, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, key["x"])
    rows, n = 8, key["n_cols"]
    x = (torch.randn(rows, n, generator=g) + 0.5).to(device, dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
    return {"x": x, "y": torch.empty_like(x), "w": w, "stride": x.stride(0), "n_cols": n,
            "eps": 1e-6}


def _reference(inputs: dict[str, Any]) -> torch.Tensor:
    x, w = inputs["x"].float(), inputs["w"].float()
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + inputs["eps"]) * w


@kdispatch.dispatch(
    name="example.rmsnorm", key=["x", "n_cols"], configs=CONFIGS,
    buckets={"n_cols": pow2_bucket}, heuristic=_heuristic, tables=[TABLES],
    grid=lambda meta: (meta["x"].shape[0],),
    inputs=_inputs, reference=_reference, outputs=["y"],
    tolerance=lambda key: {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3)}[key["x"]],
    bytes_moved=lambda key: 8 * key["n_cols"] * 2 * (4 if key["x"] == "float32" else 2),
    tune_keys=[{"x": "float32", "n_cols": 1000}, {"x": "float16", "n_cols": 3000}],
)
@triton.jit
def _rmsnorm(x, y, w, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x + row * stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += v * v
    inv = 1.0 / tl.sqrt(tl.sum(acc, 0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.load(x + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y + row * stride + cols, (v * inv * g).to(y.dtype.element_ty), mask=mask)


RMSNORM = _rmsnorm


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim of a contiguous ``[rows, n]`` tensor."""
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"x: expected a contiguous [rows, n] tensor, got {tuple(x.shape)}")
    y = torch.empty_like(x)
    _rmsnorm[lambda meta: (x.shape[0],)](x, y, w, x.stride(0), x.shape[1], eps)
    return y
