"""Helpers shared by the built-in op packages: input checks, interpreter and PDL detection."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import torch

from kdispatch.dtypes import FP8_MAX


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


FP8_TORCH_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor | None,
                 dtype: torch.dtype) -> torch.Tensor:
    """``x / scale`` computed in fp32, saturated to the format's range, rounded to ``dtype``:
    what an fp8 cache stores (the writer's specification, and how tests build fp8 caches).

    Parameters
    ----------
    x : Tensor (float32, float16 or bfloat16)
    scale : one-element float32 Tensor, or None (1.0)
    dtype : torch.float8_e4m3fn or torch.float8_e4m3fnuz

    Returns
    -------
    Tensor of ``dtype`` shaped like ``x``. NaN stays NaN; +-inf saturate.
    """
    y = x.float()
    if scale is not None:
        y = y / scale.float().reshape(())
    fmax = FP8_MAX[str(dtype).removeprefix("torch.")]
    return y.clamp(-fmax, fmax).to(dtype)


@functools.lru_cache(maxsize=None)
def _fp8_support(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``device`` cannot run fp8 caches of ``dtype`` (None: it can). Host properties
    only (cached), never device memory."""
    fnuz = dtype == torch.float8_e4m3fnuz
    if device.type == "cpu":
        # Triton 3.6's interpreter has no fp8e4b8 type ("fail to convert fp8e4b8 to ir type")
        return "the Triton interpreter cannot run float8_e4m3fnuz" if fnuz else None
    if torch.version.hip:
        return None  # fnuz on gfx942, e4m3fn on gfx950: Triton says which it lowers
    if fnuz:
        return "float8_e4m3fnuz is AMD's fp8 format; NVIDIA GPUs use float8_e4m3fn"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "fp8 (e4m3) conversions need an NVIDIA GPU of compute capability 8.9 or newer"
    return None


def check_fp8(name: str, t: torch.Tensor) -> None:
    """Raise ValueError naming ``name`` when ``t``'s fp8 dtype cannot run on its device."""
    if t.dtype in FP8_TORCH_DTYPES:
        why = _fp8_support(t.dtype, t.device)
        if why is not None:
            raise ValueError(f"{name}: {why}")


def check_scales(k_scale: Any, v_scale: Any, cache: torch.Tensor,
                 cache_name: str = "k_cache") -> None:
    """Raise ValueError naming the argument unless ``k_scale``/``v_scale`` are both None or
    both one-element float32 tensors on ``cache``'s device, given only for an fp8 cache.

    The scales are per-tensor dequantization factors (``real = stored * scale``) read by
    the kernel, so a captured graph replays correctly after they change.
    """
    if k_scale is None and v_scale is None:
        return
    for name, s, other in (("k_scale", k_scale, "v_scale"), ("v_scale", v_scale, "k_scale")):
        if s is None:
            raise ValueError(f"{name}: {other} was given without {name}; pass both or neither")
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"{name}: expected a one-element float32 tensor, got "
                             f"{type(s).__name__}")
        if s.dtype != torch.float32 or s.numel() != 1:
            raise ValueError(f"{name}: expected a one-element float32 tensor, got dtype "
                             f"{str(s.dtype).removeprefix('torch.')} and shape "
                             f"{tuple(s.shape)}")
        if s.device != cache.device:
            raise ValueError(f"{name}: on {s.device}, expected {cache.device} (the "
                             f"{cache_name}'s device: the kernel reads it)")
    if cache.dtype not in FP8_TORCH_DTYPES:
        raise ValueError(f"k_scale: scales apply to an fp8 cache only; {cache_name} is "
                         f"{str(cache.dtype).removeprefix('torch.')}")
