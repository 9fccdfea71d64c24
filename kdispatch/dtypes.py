"""The dtypes kdispatch's keys speak of: their names, aliases and torch dtypes (one place).

Keys store dtype *names* (``"bfloat16"``), never torch objects, so a key is plain JSON and
resolving one on a machine without torch's CUDA build still works.

Activations (queries, new K/V rows) are one of :data:`FLOAT_DTYPES`; a KV cache may also
be an fp8 format (:data:`FP8_DTYPES`, with per-tensor float32 scales): ``float8_e4m3fn``
(OCP e4m3, NVIDIA sm_89+ and the interpreter) or ``float8_e4m3fnuz`` (the AMD MI300 form).
"""

from __future__ import annotations

from typing import Any, Literal

#: floating-point dtypes of activations and caches
FLOAT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
DType = Literal["float32", "float16", "bfloat16"]
#: fp8 cache dtypes (per-tensor scales; values quantized as ``x / scale``, saturating)
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e4m3fnuz")
#: dtypes a KV cache may have
CACHE_DTYPES: tuple[str, ...] = FLOAT_DTYPES + FP8_DTYPES
CacheDType = Literal["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz"]
#: the largest finite value of each fp8 format (quantization saturates to it)
FP8_MAX: dict[str, float] = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0}

_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
            "bf16": "bfloat16", "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
            "e4m3fn": "float8_e4m3fn", "fp8_e4m3fnuz": "float8_e4m3fnuz",
            "e4m3fnuz": "float8_e4m3fnuz"}


def dtype_name(dtype: Any, name: str = "dtype",
               allowed: tuple[str, ...] = FLOAT_DTYPES) -> str:
    """The canonical name of a torch dtype or a dtype string, if it is in ``allowed``.

    >>> dtype_name("bf16")
    'bfloat16'
    >>> dtype_name("fp8", allowed=CACHE_DTYPES)
    'float8_e4m3fn'
    >>> dtype_name("int8")
    Traceback (most recent call last):
    ...
    ValueError: dtype: unsupported dtype 'int8'; expected one of float32, float16, bfloat16
    """
    if isinstance(dtype, str):
        text = _ALIASES.get(dtype, dtype)
    else:
        text = str(dtype).removeprefix("torch.")
    if text in allowed:
        return text
    raise ValueError(f"{name}: unsupported dtype {dtype!r}; expected one of "
                     f"{', '.join(allowed)}")


def is_fp8(name: str) -> bool:
    """Whether the dtype called ``name`` is an fp8 cache format.

    >>> is_fp8("float8_e4m3fn"), is_fp8("bfloat16")
    (True, False)
    """
    return name in FP8_DTYPES


def torch_dtype(name: str) -> Any:
    """The torch dtype called ``name`` (``"bfloat16"`` -> ``torch.bfloat16``)."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype: {name!r} is not a torch dtype")
    return dtype


def itemsize(name: str) -> int:
    """Bytes per element of the dtype called ``name``, without importing torch.

    >>> itemsize("bfloat16"), itemsize("float32"), itemsize("float8_e4m3fn")
    (2, 4, 1)
    """
    if name.startswith("float8"):
        return 1
    return {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "int64": 8}[name]
