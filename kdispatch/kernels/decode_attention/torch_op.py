"""``torch.ops.kdispatch.decode_attention`` (functional) and ``decode_attention_out``
(writes a given output), with fake implementations for torch.compile.

Each has two overloads: the default takes the serving call's six arguments (no window,
logit cap, batch invariance, config or fp8 scales) and ``.full`` takes them all. A torch op pays
per schema argument on every call (each defaulted optional is converted into and out of
the dispatcher), so the common call does not carry six unused ones. A call through the
packet (``torch.ops.kdispatch.decode_attention(...)``) with more arguments reaches
``.full`` after the default refuses them, which costs a few microseconds: code that passes
them on every call names ``.full`` (the public function does so under torch.compile).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from kdispatch.kernels.decode_attention.launch import decode_attention as _decode
from kdispatch.kernels.decode_attention.spec import DecodeConfig
from kdispatch.torch_library import define

_ARGS = ("Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
         "float scale, int? sliding_window=None, float logit_cap=0.0, "
         "bool batch_invariant=False, str? config=None, Tensor? k_scale=None, "
         "Tensor? v_scale=None")
_LEAN = ("Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
         "float scale")
SCHEMA = f"decode_attention({_LEAN}) -> Tensor"
SCHEMA_FULL = f"decode_attention.full({_ARGS}) -> Tensor"
SCHEMA_OUT = f"decode_attention_out({_LEAN}, *, Tensor(a!) out) -> ()"
SCHEMA_OUT_FULL = f"decode_attention_out.full({_ARGS}, *, Tensor(a!) out) -> ()"


@functools.lru_cache(maxsize=256)
def parse_config(text: str) -> DecodeConfig:
    """A config from its JSON (one object per distinct text, so cached launches match)."""
    return DecodeConfig.model_validate_json(text)


def _impl_lean(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_table: torch.Tensor, seq_lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    return _decode(q, k_cache, v_cache, block_table, seq_lens, scale)


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


define("kdispatch", SCHEMA, _impl_lean, _fake)  # the default overload first: the packet
define("kdispatch", SCHEMA_FULL, _impl, _fake)  # tries overloads in definition order
define("kdispatch", SCHEMA_OUT, _impl_out_lean, _fake_out)
define("kdispatch", SCHEMA_OUT_FULL, _impl_out, _fake_out)
