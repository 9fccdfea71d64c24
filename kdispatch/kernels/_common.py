"""Helpers shared by the kernel modules: input checks, dtype names, interpreter detection."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``).

    Kernels take this as a constexpr: the interpreter keeps bf16 as raw bits, so
    arithmetic must be done in fp32 there, while the GPU keeps bf16 tensor-core dots.
    """
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def dtype_name(dtype: Any, name: str = "dtype") -> str:
    """'float32' | 'float16' | 'bfloat16' from a torch dtype or one of those strings."""
    if isinstance(dtype, str):
        if dtype in TORCH_DTYPES:
            return dtype
        aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                   "half": "float16", "float": "float32"}
        if dtype in aliases:
            return aliases[dtype]
    elif dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise ValueError(f"{name}: unsupported dtype {dtype!r}; expected one of "
                     f"{', '.join(TORCH_DTYPES)}")


def check_tensor(name: str, t: Any, *, ndim: int | None = None,
                 dtypes: Iterable[torch.dtype] | None = None,
                 device: torch.device | None = None, last_contiguous: bool = False) -> None:
    """Raise ValueError naming ``name`` when ``t`` is not a tensor of the expected form."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            raise ValueError(f"{name}: dtype {t.dtype} not in {dtypes}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device}")
    if last_contiguous and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous (stride 1), got strides "
                         f"{tuple(t.stride())}")


def check_runnable(name: str, t: torch.Tensor) -> None:
    """CPU tensors run only under the Triton interpreter; say so instead of crashing."""
    if t.device.type == "cpu" and not interpreting():
        raise ValueError(f"{name}: CPU tensors need the Triton interpreter: set "
                         "TRITON_INTERPRET=1 before kdispatch's kernels are imported")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: unsupported device {t.device}")


@functools.lru_cache(maxsize=None)
def supports_pdl(device: torch.device) -> bool:
    """True for a CUDA device of compute capability 9.0+ outside the interpreter
    (programmatic dependent launch: ``griddepcontrol`` and the launch attribute)."""
    if device.type != "cuda" or interpreting() or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_capable(key: Any) -> bool:
    """The same question for a dispatch key's device fields (NVIDIA sm_90 and newer)."""
    arch = key.arch
    return key.vendor == "nvidia" and arch.startswith("sm_") and int(arch[3:]) >= 90
