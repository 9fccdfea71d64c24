"""Checks shared by the kernel tests: random non-zero inputs and comparisons with the
references (importable from every test: ``tests`` is on pytest's python path)."""

from __future__ import annotations

from typing import Any

import torch

from kdispatch.kernels.decode_attention import reference_decode_attention
from kdispatch.kernels.kv_write import launch_kv_write, reference_kv_write


def rand_nonzero(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: Any,
                 spread: float = 1.0) -> torch.Tensor:
    """Uniform in +-[0.25, 1.25] x ``spread``: random and never zero."""
    x = torch.rand(*shape, generator=gen) * 2 - 1
    return ((x + torch.where(x >= 0, 0.25, -0.25)) * spread).to(dtype).to(device)


def fp8_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of fp8 ``t`` with every NaN as 0x7f: IEEE leaves a NaN's sign to the
    arithmetic (a GPU's multiply returns its canonical NaN, the CPU's cast keeps -NaN's
    sign), so only NaN-ness is compared."""
    b = t.view(torch.uint8)
    return torch.where(b & 0x7F == 0x7F, 0x7F, b)


def write_masks(device: Any, tokens: int, masking: str, seed: int = 7) -> tuple[Any, Any]:
    """``(row_mask, active_rows)`` for ``masking`` ("none", "row_mask", "active_rows",
    "both"): a random mask keeping the first and last row, 11 active rows."""
    gen = torch.Generator().manual_seed(seed)
    row_mask = active_rows = None
    if masking in ("row_mask", "both"):
        row_mask = (torch.rand(tokens, generator=gen) < 0.6).to(device)
        row_mask[0] = row_mask[-1] = True
    if masking in ("active_rows", "both"):
        active_rows = torch.tensor([11], dtype=torch.int32, device=device)
    return row_mask, active_rows


def check_write(cfg: Any, case: dict, row_mask: Any = None, active_rows: Any = None) -> None:
    """Launch the KV writer with ``cfg``; both entire pools equal the reference bit for bit."""
    ref_k, ref_v = reference_kv_write(**case, row_mask=row_mask, active_rows=active_rows)
    launch_kv_write(cfg, **case, row_mask=row_mask, active_rows=active_rows)
    torch.testing.assert_close(case["key_cache"].float(), ref_k, atol=0, rtol=0)
    torch.testing.assert_close(case["value_cache"].float(), ref_v, atol=0, rtol=0)


def check_decode(out: torch.Tensor, args: tuple, tol: dict, **kw: Any) -> torch.Tensor:
    """``out`` (q's dtype and the reference's shape) within ``tol[q.dtype]`` of the fp32
    reference of the decode ``args`` (q, caches, table, lengths); returns the reference."""
    ref = reference_decode_attention(*args, **kw)
    atol, rtol = tol[args[0].dtype]
    assert out.dtype == args[0].dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    return ref
