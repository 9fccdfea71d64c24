"""Helpers shared by the built-in op packages: input checks, interpreter and PDL detection."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import torch


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``).

    Kernels take this as a constexpr: the interpreter keeps bf16 as raw bits, so
    arithmetic must be done in fp32 there, while the GPU keeps bf16 tensor-core dots.
    """
    return os.environ.get("TRITON_INTERPRET", "") == "1"


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
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"{name}: dtype {str(t.dtype).removeprefix('torch.')} is not "
                             f"supported here; expected {names}")
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
    return key.vendor == "nvidia" and arch.startswith("sm_") and int(arch[3:].rstrip("a")) >= 90


def tensor_sig(t: Any) -> tuple[Any, ...] | None:
    """What a cached launch depends on for one optional tensor: shape, strides, dtype,
    device and pointer alignment (Triton specializes on 16-byte alignment)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)
