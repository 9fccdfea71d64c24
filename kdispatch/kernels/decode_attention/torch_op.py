"""``torch.ops.kdispatch.decode_attention`` (functional) and ``decode_attention_out``
(writes a given output), with fake implementations for torch.compile.

Each has two overloads: the default takes the serving call's six arguments (no window,
logit cap, batch invariance, config or fp8 scales) and ``.full`` takes them all. A torch op pays
per schema argument on every call (each defaulted optional is converted into and out of
the dispatcher), so the common call does not carry six unused ones. A call through the
packet (``torch.ops.kdispatch.decode_attention(...)``) with more arguments reaches
``.full`` after the default refuses them, which costs a few microseconds: code that passes
them on every call names ``.full`` (the public function does so under torch.compile).

Where the native launch cache is built (``kdispatch build-ops``; see
:mod:`kdispatch.native`), the default overloads' CUDA kernels are C++: a call whose tensors
have the layout of one the Python path already launched directly is served there (output
and workspace allocated, stage 1 and the reduce launched) without a trip into Python; any
other call (a Gluon tile's, whose TMA descriptors are built per call, or a new layout)
goes to a slow twin of the same schema (``kdispatch::_decode_attention_slow``,
``kdispatch::_decode_attention_out_slow``: the Python path), which hands its launches to
the cache. ``KDISPATCH_FAST_OPS=0`` keeps the Python kernels.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from kdispatch.kernels.decode_attention.launch import cached_entry
from kdispatch.kernels.decode_attention.launch import decode_attention as _decode
from kdispatch.kernels.decode_attention.spec import DecodeConfig
from kdispatch.native import ops as _native
from kdispatch.torch_library import define, define_native

_ARGS = ("Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
         "float scale, int? sliding_window=None, float logit_cap=0.0, "
         "bool batch_invariant=False, str? config=None, Tensor? k_scale=None, "
         "Tensor? v_scale=None")
_LEAN = ("Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
         "float scale")
SCHEMA = f"decode_attention({_LEAN}) -> Tensor"
NATIVE_OP = "kdispatch::decode_attention"
SCHEMA_FULL = f"decode_attention.full({_ARGS}) -> Tensor"
SCHEMA_OUT = f"decode_attention_out({_LEAN}, *, Tensor(a!) out) -> ()"
NATIVE_OUT_OP = "kdispatch::decode_attention_out"
#: the argument positions of the call's tensors: q, k_cache, v_cache, block_table,
#: seq_lens (then ``out``, after ``scale``, for the out= form)
_TENSORS, _TENSORS_OUT = (0, 1, 2, 3, 4), (0, 1, 2, 3, 4, 6)
SCHEMA_OUT_FULL = f"decode_attention_out.full({_ARGS}, *, Tensor(a!) out) -> ()"


@functools.lru_cache(maxsize=256)
def parse_config(text: str) -> DecodeConfig:
    """A config from its JSON (one object per distinct text, so cached launches match)."""
    return DecodeConfig.model_validate_json(text)


def _impl_lean(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_table: torch.Tensor, seq_lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    return _decode(q, k_cache, v_cache, block_table, seq_lens, scale)


def _remember(op: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor,
              out: torch.Tensor | None) -> None:
    """Hand the Python path's direct launches of this plain call to the native cache."""
    e = cached_entry(q, k_cache, v_cache, block_table, seq_lens, out)
    if e is not None and e.stage1 is not None and not e.plan.capped:
        launches, allocs = native_launches(e, q.dtype, out is not None)
        tensors = (q, k_cache, v_cache, block_table, seq_lens, *(() if out is None else (out,)))
        _native.add_launches(op, tensors, launches, keep=(e.zeros,), allocs=allocs,
                             returns=-1 if out is not None else 0, counter=e.resolved)


def _impl_slow(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_table: torch.Tensor, seq_lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    """The native kernel's miss: the Python path, then its direct launches to the cache."""
    o = _decode(q, k_cache, v_cache, block_table, seq_lens, scale)
    _remember(NATIVE_OP, q, k_cache, v_cache, block_table, seq_lens, None)
    return o


def _impl_out_slow(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                   out: torch.Tensor) -> None:
    _decode(q, k_cache, v_cache, block_table, seq_lens, scale, out)
    _remember(NATIVE_OUT_OP, q, k_cache, v_cache, block_table, seq_lens, out)


def native_launches(e: Any, dtype: torch.dtype, out_given: bool = False
                    ) -> tuple[list[_native.NativeLaunch], list[tuple[Any, Any, bool]]]:
    """A plain call's launches of cache entry ``e`` (tensors 0-4: q, k_cache, v_cache,
    block_table, seq_lens, and 5 the output when ``out_given``; argument 5: scale) and its
    allocations: the output unless given (``dtype``, q's), then the partials buffer
    (partial outputs, then their lse at a byte offset) and the zeroed counters where the
    plan has them -- what the Python direct path passes, slot for slot."""
    p = e.plan
    allocs: list[tuple[Any, Any, bool]] = []
    if out_given:
        out: tuple[Any, ...] = ("tensor", 5)
    else:
        out = ("alloc", 0)
        allocs.append((p.out_shape, dtype, False))
    po = pl = cnt = out
    if p.partials_shape is not None:
        ws = len(allocs)
        allocs.append(((e.tail2[0],), torch.float32, False))
        po, pl = ("alloc", ws), ("alloc", ws, e.tail2[1])
        cnt = pl
        if p.counters_shape is not None:
            cnt = ("alloc", len(allocs))
            allocs.append((p.counters_shape, torch.int32, True))
    sl = ("tensor", 4)
    kv = (("tensor", 1),) if p.latent else (("tensor", 1), ("tensor", 2))
    stage1 = [("tensor", 0), *kv, ("tensor", 3), sl, out, po, pl, cnt, sl, sl,
              ("ptr", e.zeros.data_ptr()), ("scalar", 5, p.log2e_scale), 1.0, *e.tail1]
    launches = [_native.NativeLaunch.of(e.stage1, stage1)]
    if e.reduce is not None:
        launches.append(_native.NativeLaunch.of(e.reduce, [sl, po, pl, out, *e.tail2[2:]]))
    return launches, allocs


def _impl_out_lean(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
                   out: torch.Tensor) -> None:
    _decode(q, k_cache, v_cache, block_table, seq_lens, scale, out)


def _impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
          sliding_window: int | None = None, logit_cap: float = 0.0,
          batch_invariant: bool = False, config: str | None = None,
          k_scale: torch.Tensor | None = None,
          v_scale: torch.Tensor | None = None) -> torch.Tensor:
    return _decode(q, k_cache, v_cache, block_table, seq_lens, scale, None, sliding_window,
                   logit_cap, batch_invariant, None if config is None else parse_config(config),
                   k_scale, v_scale)


def _impl_out(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
              sliding_window: int | None = None, logit_cap: float = 0.0,
              batch_invariant: bool = False, config: str | None = None,
              k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, *,
              out: torch.Tensor) -> None:
    _decode(q, k_cache, v_cache, block_table, seq_lens, scale, out, sliding_window, logit_cap,
            batch_invariant, None if config is None else parse_config(config), k_scale,
            v_scale)


def _fake(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, scale: Any,
          sliding_window: Any = None, logit_cap: Any = 0.0, batch_invariant: Any = False,
          config: Any = None, k_scale: Any = None, v_scale: Any = None) -> Any:
    return q.new_empty((*q.shape[:-1], v_cache.shape[3]))  # [B, (Q,) Hq, Dv]


def _fake_out(*args: Any, out: Any, **kwargs: Any) -> None:
    return None


# each default overload first: the packet tries overloads in definition order
define_native("kdispatch", SCHEMA, _impl_lean, _fake, _impl_slow, _TENSORS)
define("kdispatch", SCHEMA_FULL, _impl, _fake)
define_native("kdispatch", SCHEMA_OUT, _impl_out_lean, _fake_out, _impl_out_slow,
              _TENSORS_OUT)
define("kdispatch", SCHEMA_OUT_FULL, _impl_out, _fake_out)
