"""kdispatch: Triton decode kernels for LLM inference and the dispatcher that configures them.

Public API (everything else is importable but private)::

    kdispatch.write_kv(...)            # paged K/V cache writer (op "kv_write")
    kdispatch.decode_attention(...)    # split-KV paged decode attention (op "decode_attention")
    kdispatch.resolve(op, **args)      # the launch config, from shapes alone
    kdispatch.explain(op, **args)      # ... with its key and provenance
    kdispatch.stats()                  # resolution counters and misses
    kdispatch.Device                   # the device model
"""

from kdispatch._version import __version__
from kdispatch.api import decode_attention, explain, resolve, stats, write_kv
from kdispatch.device import Device
from kdispatch.dispatcher import Explanation, Stats
from kdispatch.dispatcher import reset as reset_dispatcher
from kdispatch.errors import KDispatchWarning, StoreError, StrictMissError
from kdispatch.registry import OpConfig, OpKey, OpSpec, get_op, op_names, register
from kdispatch.store import Store

__all__ = [
    "Device", "Explanation", "KDispatchWarning", "OpConfig", "OpKey", "OpSpec", "Stats",
    "Store", "StoreError", "StrictMissError", "__version__", "decode_attention", "explain",
    "get_op", "op_names", "register", "reset_dispatcher", "resolve", "stats", "write_kv",
]
