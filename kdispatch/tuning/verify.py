"""Correctness gate of the tuner: run a candidate and compare it with the fp32 reference.

A candidate ends in one of three states:

- ``"ok"``: every output is within the op's ``(atol, rtol)`` of the reference;
- ``"rejected"``: it ran but its output is wrong (outside tolerance, NaN, wrong shape);
- ``"infeasible"``: it cannot run on this device: a Triton compile error, an
  out-of-resources error (shared memory, registers) or a CUDA out-of-memory error.

Any other exception is a programming error and propagates (as Triton's autotuner does in
``_bench``): the tuner must not quietly record a bug as a slow or missing config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

Status = Literal["ok", "rejected", "infeasible"]


def infeasible_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "this config cannot run here" rather than "bug"."""
    errors: list[type[BaseException]] = [torch.cuda.OutOfMemoryError]
    try:
        from triton.runtime.errors import OutOfResources
        errors.append(OutOfResources)
    except ImportError:  # pragma: no cover - triton is a dependency
        pass
    try:
        from triton.runtime.errors import PTXASError  # ptxas rejecting the kernel
        errors.append(PTXASError)
    except ImportError:  # pragma: no cover - older triton
        pass
    try:
        from triton.compiler.errors import CompilationError
        errors.append(CompilationError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one candidate.

    Attributes
    ----------
    status : {"ok", "rejected", "infeasible"}
    max_error : float or None
        Largest absolute difference from the reference over all outputs (``inf`` when an
        output has NaN/inf where the reference is finite); None when it did not run.
    error : str or None
        Why it was rejected or infeasible.
    """

    status: Status
    max_error: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def as_tensors(out: Any, name: str = "output") -> list[torch.Tensor]:
    """A tensor or a tuple/list of tensors as a list; anything else is a TypeError."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Sequence) and not isinstance(out, str | bytes):
        items = list(out)
        for i, t in enumerate(items):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}]: expected a torch.Tensor, got {type(t).__name__}")
        return items
    raise TypeError(f"{name}: expected a tensor or a tuple of tensors, got {type(out).__name__}")


def compare(out: Any, ref: Any, atol: float, rtol: float) -> Verdict:
    """Compare candidate output(s) with the reference: ``|out - ref| <= atol + rtol*|ref|``.

    Parameters
    ----------
    out : Tensor or tuple of Tensors
        What the candidate produced (any float dtype; compared in fp32).
    ref : Tensor or tuple of Tensors
        The fp32 reference, same structure and shapes.
    atol, rtol : float
        Tolerances (the op's ``tolerance(key)``).

    Returns
    -------
    Verdict
        ``ok`` or ``rejected`` (with the largest absolute error). NaN never passes.

    Examples
    --------
    >>> compare(torch.ones(3), torch.ones(3), 1e-3, 0.0).status
    'ok'
    >>> compare(torch.tensor([1.0, float("nan")]), torch.ones(2), 1.0, 1.0).status
    'rejected'
    """
    outs, refs = as_tensors(out, "output"), as_tensors(ref, "reference")
    if len(outs) != len(refs):
        return Verdict("rejected", None, f"returned {len(outs)} tensors, reference has "
                                         f"{len(refs)}")
    worst = 0.0
    problems: list[str] = []
    for i, (o, r) in enumerate(zip(outs, refs)):
        if tuple(o.shape) != tuple(r.shape):
            return Verdict("rejected", None, f"output {i} has shape {tuple(o.shape)}, "
                                             f"reference {tuple(r.shape)}")
        if r.numel() == 0:
            continue
        of = o.detach().to(device=r.device, dtype=torch.float32)
        rf = r.detach().float()
        if bool(torch.isnan(rf).any()):
            raise ValueError(f"reference output {i} contains NaN: the reference or the "
                             "inputs are broken")
        close = torch.isclose(of, rf, rtol=rtol, atol=atol, equal_nan=False)
        diff = (of - rf).abs()
        finite = torch.isfinite(of) | (of == rf)  # an inf matching an inf is exact
        err = float(torch.where(finite, diff.nan_to_num(nan=0.0), torch.full_like(diff,
                                math.inf)).max())
        worst = max(worst, err)
        if not bool(close.all()):
            bad = int((~close).sum())
            nans = int(torch.isnan(of).sum())
            problems.append(f"output {i}: {bad}/{close.numel()} elements outside "
                            f"atol={atol:g} rtol={rtol:g}" + (f" ({nans} NaN)" if nans else "")
                            + f", max abs error {err:.4g}")
    if problems:
        return Verdict("rejected", worst, "; ".join(problems))
    return Verdict("ok", worst, None)


def run_candidate(tuning: Any, config: Any, inputs: dict[str, Any]) -> Any:
    """``tuning.run(config, inputs)`` and wait for it; infeasible errors propagate as such."""
    out = tuning.run(config, inputs)
    tensors = as_tensors(out)
    if tensors and tensors[0].is_cuda:
        torch.cuda.synchronize(tensors[0].device)
    return out


def describe(exc: BaseException) -> str:
    """One line naming an exception: ``Type: first line of its message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:500]}" if text else type(exc).__name__


def verify(tuning: Any, key: Any, config: Any, inputs: dict[str, Any],
           reference: Any) -> Verdict:
    """Run ``config`` on ``inputs`` and check it against ``reference``.

    Parameters
    ----------
    tuning : OpTuning
        The op's tuning face (its ``run`` and ``tolerance`` are used).
    key : OpKey
        The key the inputs were made for (selects the tolerance).
    config : OpConfig
        The candidate.
    inputs : dict
        Inputs equal to those the reference was computed on (the key's working copy, reset
        before each candidate: a candidate may write into them).
    reference : Tensor or tuple of Tensors
        ``tuning.reference`` of those inputs, computed before any candidate ran on them.

    Returns
    -------
    Verdict
        ``ok``, ``rejected`` (wrong output) or ``infeasible`` (compile/resource/OOM error).

    Raises
    ------
    Exception
        Anything else the candidate raises (a programming error) propagates.
    """
    try:
        out = run_candidate(tuning, config, inputs)
    except infeasible_errors() as exc:
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        return Verdict("infeasible", None, describe(exc))
    atol, rtol = tuning.tolerance(key)
    return compare(out, reference, atol, rtol)
