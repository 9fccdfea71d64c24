"""``torch.ops.kdispatch.write_kv``: the writer as a torch op that mutates the two caches.

Two overloads, as for decode (see its ``torch_op`` module): the default takes the five
arguments of a plain write, ``.full`` adds the row mask, active rows, config and fp8
scales.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from kdispatch.kernels.kv_write.launch import write_kv as _write_kv
from kdispatch.kernels.kv_write.spec import KVWriteConfig
from kdispatch.torch_library import define

_LEAN = ("Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
         "Tensor slot_mapping")
SCHEMA = f"write_kv({_LEAN}) -> ()"
SCHEMA_FULL = (f"write_kv.full({_LEAN}, Tensor? row_mask=None, Tensor? active_rows=None, "
               "str? config=None, Tensor? k_scale=None, Tensor? v_scale=None) -> ()")


@functools.lru_cache(maxsize=256)
def parse_config(text: str) -> KVWriteConfig:
    """A config from its JSON (one object per distinct text, so cached launches match)."""
    return KVWriteConfig.model_validate_json(text)


def _impl_lean(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
               value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    _write_kv(key, value, key_cache, value_cache, slot_mapping)


def _impl(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
          value_cache: torch.Tensor, slot_mapping: torch.Tensor,
          row_mask: torch.Tensor | None = None, active_rows: torch.Tensor | None = None,
          config: str | None = None, k_scale: torch.Tensor | None = None,
          v_scale: torch.Tensor | None = None) -> None:
    _write_kv(key, value, key_cache, value_cache, slot_mapping, row_mask, active_rows,
              None if config is None else parse_config(config), k_scale, v_scale)


def _fake(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
          row_mask: Any = None, active_rows: Any = None, config: Any = None,
          k_scale: Any = None, v_scale: Any = None) -> None:
    return None


define("kdispatch", SCHEMA, _impl_lean, _fake)  # first: the packet tries it first
define("kdispatch", SCHEMA_FULL, _impl, _fake)
