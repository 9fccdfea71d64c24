"""Row softmax as a full :class:`kdispatch.Op`: a key model, a config model with validity,
plain-form arguments (the CLI's options), a launch plan, and an :class:`kdispatch.OpTuning`.

The source hash covers ``_softmax_kernel`` and ``plan`` (the constexpr mapping): editing a
comment here keeps the shipped table valid; editing either function makes it stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import triton
import triton.language as tl
from pydantic import Field

import kdispatch
from kdispatch.buckets import pow2_bucket

TABLES = Path(__file__).resolve().parent / "tables"
DTypes = Literal["float32", "float16"]


@triton.jit
def _softmax_kernel(x, y, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + row * stride + cols, mask=cols < n_cols, other=float("-inf"))
    v = v.to(tl.float32)
    e = tl.exp(v - tl.max(v, 0))
    tl.store(y + row * stride + cols, (e / tl.sum(e, 0)).to(y.dtype.element_ty),
             mask=cols < n_cols)


class SoftmaxKey(kdispatch.OpKey):
    dtype: DTypes
    n_cols: int = Field(ge=1, le=1 << 16)  # bucketed to a power of two


class SoftmaxConfig(kdispatch.OpConfig):
    block: int = Field(default=1024, ge=16, le=1 << 16)


class SoftmaxArgs(kdispatch.PlainArgs):
    dtype: DTypes = Field(default="float32", description="Input dtype.")
    n_cols: int = Field(ge=1, le=1 << 16, description="Row length.")


def plan(config: SoftmaxConfig, rows: int) -> tuple[tuple[int], dict[str, Any]]:
    """Grid and constexprs: one program per row, the whole row in one block."""
    return (rows,), {"BLOCK": config.block}


class _Tuning(kdispatch.OpTuning):
    def candidates(self, key: SoftmaxKey) -> list[SoftmaxConfig]:
        first = max(16, key.n_cols)
        return [SoftmaxConfig(block=b, num_warps=w) for b in (first, 2 * first)
                for w in (1, 2, 4, 8) if b <= 1 << 16]

    def make_inputs(self, key: SoftmaxKey, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, key.n_cols, generator=g).to(device, getattr(torch, key.dtype))
        return {"x": x}

    def run(self, config: Any, inputs: dict[str, Any]) -> torch.Tensor:
        return SOFTMAX.launch(config, **inputs)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.softmax(inputs["x"].float(), -1)

    def tolerance(self, key: SoftmaxKey) -> tuple[float, float]:
        # fp32: exp and one division per element (~1e-7 relative); fp16: one rounding of
        # the output (2^-11)
        return {"float32": (1e-6, 1e-5), "float16": (1e-3, 1e-3)}[key.dtype]

    def bytes_moved(self, key: SoftmaxKey) -> int:
        return 4 * key.n_cols * 2 * (4 if key.dtype == "float32" else 2)

    def default_args(self) -> list[dict[str, Any]]:
        return [{"dtype": "float32", "n_cols": 100}, {"dtype": "float16", "n_cols": 700}]


class SoftmaxOp(kdispatch.Op):
    name = "example.softmax"
    key_model = SoftmaxKey
    config_model = SoftmaxConfig
    args_model = SoftmaxArgs
    kernels = (_softmax_kernel,)
    launch_code = (plan,)
    table_dirs = (TABLES,)
    tuning = _Tuning()

    def key(self, device: Any, args: Mapping[str, Any]) -> SoftmaxKey:
        x = args.get("x")
        if x is not None:
            dtype, n = str(x.dtype).removeprefix("torch."), x.shape[-1]
        else:
            plain = self.plain_args(args)
            dtype, n = plain["dtype"], plain["n_cols"]
        return SoftmaxKey(**kdispatch.OpKey.device_fields(device), dtype=dtype,
                          n_cols=pow2_bucket(n))

    def heuristic(self, key: SoftmaxKey) -> SoftmaxConfig:
        return SoftmaxConfig(block=max(16, key.n_cols), num_warps=4 if key.n_cols >= 2048 else 1)

    def is_valid(self, key: SoftmaxKey, config: SoftmaxConfig) -> bool:
        return config.block >= key.n_cols  # the whole row in one block

    def launch(self, config: SoftmaxConfig, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        grid, consts = plan(config, x.shape[0])
        _softmax_kernel[grid](x, y, x.stride(0), x.shape[1], **consts,
                              num_warps=config.num_warps)
        return y


SOFTMAX = kdispatch.register(SoftmaxOp(), replace=True)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a contiguous ``[rows, n]`` float32/float16 tensor."""
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"x: expected a contiguous [rows, n] tensor, got {tuple(x.shape)}")
    return SOFTMAX.launch(kdispatch.resolve("example.softmax", x=x), x)
