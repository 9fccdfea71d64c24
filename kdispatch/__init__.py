"""kdispatch: Triton decode kernels for LLM inference and the dispatcher that configures them.

Public API (everything else is importable but private)::

    kdispatch.write_kv(...)            # paged K/V cache writer (op "kv_write")
    kdispatch.decode_attention(...)    # split-KV paged decode attention (op "decode_attention")
    kdispatch.resolve(op, **args)      # the launch config, from shapes alone
    kdispatch.explain(op, **args)      # ... with its key and provenance
    kdispatch.stats()                  # resolution counters and misses
    kdispatch.dispatch(...)            # dispatch your own @triton.jit kernel (decorator)
    kdispatch.Op, OpTuning, OpKey, OpConfig, register   # ... or define a whole op

Attributes load on first use: ``import kdispatch`` imports neither torch nor pydantic,
and the Triton interpreter can still be selected before any kernel is decorated. The torch
ops ``torch.ops.kdispatch.*`` are registered when the op's package loads (first use of its
function, or :func:`load_torch_ops`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kdispatch._version import __version__

if TYPE_CHECKING:  # the static view of the lazy attributes below
    from kdispatch.api import explain, resolve, stats
    from kdispatch.device import Device
    from kdispatch.dispatcher import Explanation, Stats
    from kdispatch.dispatcher import reset as reset_dispatcher
    from kdispatch.errors import KDispatchWarning, StoreError, StrictMissError
    from kdispatch.kernel_op import Config, KernelOp, dispatch
    from kdispatch.kernels.decode_attention import decode_attention
    from kdispatch.kernels.kv_write import write_kv
    from kdispatch.opdef import Op, OpConfig, OpKey, OpTuning, PlainArgs
    from kdispatch.registry import get_op, op_names, register, unregister
    from kdispatch.store import Store

_LAZY: dict[str, str] = {
    "resolve": "kdispatch.api", "explain": "kdispatch.api", "stats": "kdispatch.api",
    "Device": "kdispatch.device",
    "Explanation": "kdispatch.dispatcher", "Stats": "kdispatch.dispatcher",
    "KDispatchWarning": "kdispatch.errors", "StoreError": "kdispatch.errors",
    "StrictMissError": "kdispatch.errors",
    "Config": "kdispatch.kernel_op", "KernelOp": "kdispatch.kernel_op",
    "dispatch": "kdispatch.kernel_op",
    "decode_attention": "kdispatch.kernels.decode_attention",
    "write_kv": "kdispatch.kernels.kv_write",
    "Op": "kdispatch.opdef", "OpConfig": "kdispatch.opdef", "OpKey": "kdispatch.opdef",
    "OpTuning": "kdispatch.opdef", "PlainArgs": "kdispatch.opdef",
    "get_op": "kdispatch.registry", "op_names": "kdispatch.registry",
    "register": "kdispatch.registry", "unregister": "kdispatch.registry",
    "Store": "kdispatch.store",
}

__all__ = [
    "Config", "Device", "Explanation", "KDispatchWarning", "KernelOp", "Op", "OpConfig",
    "OpKey", "OpTuning", "PlainArgs", "Stats", "Store", "StoreError", "StrictMissError",
    "__version__", "decode_attention", "dispatch", "explain", "get_op", "load_torch_ops",
    "op_names", "register", "reset_dispatcher", "resolve", "stats", "unregister", "write_kv",
]


def __getattr__(name: str) -> Any:
    if name == "reset_dispatcher":
        return importlib.import_module("kdispatch.dispatcher").reset
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kdispatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def load_torch_ops() -> list[str]:
    """Load every registered op (registering its ``torch.ops.kdispatch.*`` ops) and return
    the op names; for code that calls ``torch.ops.kdispatch`` directly."""
    registry = importlib.import_module("kdispatch.registry")
    return [op.name for op in registry.all_ops()]
