"""Compiling a kernel launch ahead, for a GPU target, without the GPU.

A :class:`~kdispatch.launching.KernelLaunch` holds live tensors; :func:`describe` turns it
into a :class:`LaunchSpec` a pool process can take: the jit function by module and
qualified name, every tensor replaced by its dtype and its pointer's residue modulo 16
(Triton specializes pointers on 16-byte alignment, so a misaligned view is reproduced, not
skipped), integers and floats as they are (their values decide Triton's specialization:
``== 1``, ``% 16 == 0``, 32 or 64 bits), the constexprs and the launch options, and the
target (backend, arch, warp size).

:func:`compile_spec` (run in a pool process) binds those arguments exactly as
``JITFunction.run`` does (same binder, same injected ``debug`` and ``instrumentation_mode``
options, same ``_pack_args``) and calls ``triton.compile`` for the explicit target, so the
kernel lands in the shared on-disk Triton cache under the key the timing process's JIT
computes at launch; that launch then only loads it. It also builds the kernel's host
launcher (a small C module, also cached) where the backend's driver can be loaded.

Nothing here names an op.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger(__name__)

#: the compiler pool processes run unless a caller names another ("module:function")
DEFAULT_COMPILER = "kdispatch.tuning.precompile:compile_spec"

#: (backend, arch, warp size): ``GPUTarget`` as plain data
Target = tuple[str, Any, int]

_PLAIN = (bool, int, float, str, type(None))


class NotCompilable(Exception):
    """A spec this process cannot compile (no compiled-mode jit function, no backend, ...)."""


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as Triton specializes on it: its dtype and ``data_ptr() % 16``."""

    dtype: str
    ptr_mod16: int = 0


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel variant to compile: everything Triton's specialization reads.

    ``digest`` names the variant as Triton's JIT does (the function, the specialization of
    the bound arguments, the options, the target), not the argument values: two launches
    whose strides differ but specialize alike are one kernel, compiled once.
    """

    module: str
    qualname: str
    args: tuple[Any, ...]
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    target: Target
    digest: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True)
class Outcome:
    """What compiling one variant gave.

    Attributes
    ----------
    status : {"compiled", "failed", "skipped"}
        ``failed``: the compiler raised; ``skipped``: nothing was compiled (the function
        could not be found in compiled mode, the pool broke, ...): the timing process's JIT
        compiles it as it would without a pool.
    error : str or None
        One line ``Type: message`` (the same form the sweep records for infeasible configs).
    infeasible : bool
        The failure is a compile or resource error: the candidate cannot run here and is
        recorded infeasible without being launched. Any other failure is left to the timing
        process, where it propagates as the programming error it is.
    cache_hit : bool
        The kernel was already in the Triton cache.
    launcher : bool
        The host launcher was built (or found) in the cache too.
    seconds : float
        Time spent in the compiler.
    """

    status: Literal["compiled", "failed", "skipped"]
    error: str | None = None
    infeasible: bool = False
    cache_hit: bool = False
    launcher: bool = False
    seconds: float = 0.0


# -- describing a launch (in the timing process) ----------------------------------------------
def _jit_path(fn: Any) -> tuple[str, str] | None:
    """(module, qualname) of a ``@triton.jit`` function (compiled or interpreted)."""
    py = getattr(fn, "fn", None)
    module, qualname = getattr(py, "__module__", None), getattr(py, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname or module == "__main__":
        return None
    return module, qualname


def _arg(value: Any) -> Any:
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        dtype = str(value.dtype)
        return TensorArg(dtype.removeprefix("torch."), int(value.data_ptr()) % 16)
    if isinstance(value, _PLAIN):
        return value
    raise TypeError(f"cannot ship a {type(value).__name__} argument")


def describe(launch: Any, target: Target) -> LaunchSpec | None:
    """``launch`` (a :class:`~kdispatch.launching.KernelLaunch`) as a :class:`LaunchSpec`
    for ``target``, or None when it cannot be compiled elsewhere (a jit function defined in
    a function or in ``__main__``, an argument that is neither a tensor nor a plain value,
    arguments Triton cannot bind): the timing process then compiles it itself, as without a
    pool."""
    path = _jit_path(launch.fn)
    if path is None:
        log.debug("not precompiled: %r is not importable by name", launch.fn)
        return None
    try:
        args = tuple(_arg(a) for a in launch.args)
        consts = tuple(sorted((k, _arg(v)) for k, v in launch.constexprs.items()))
        opts = tuple(sorted((k, _arg(v)) for k, v in launch.options.items()))
    except TypeError as exc:
        log.debug("not precompiled: %s: %s", path, exc)
        return None
    target = tuple(target)  # type: ignore[assignment]
    kwargs = {**dict(consts), **dict(opts)}
    try:
        _, specialization, options = _bind(launch.fn, target, launch.args, kwargs)
    except Exception as exc:  # noqa: BLE001 - the launch itself raises it, visibly
        log.debug("not precompiled: %s: binding failed: %s", path, exc)
        return None
    return LaunchSpec(path[0], path[1], args, consts, opts, target,
                      _variant(path, specialization, options, target))


def _variant(path: tuple[str, str], specialization: Any, options: dict[str, Any],
             target: Target) -> str:
    """What Triton's JIT keys a compiled kernel on (besides the source), as a digest."""
    text = repr((path, specialization, sorted(options.items()), tuple(target)))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


_BINDERS: dict[tuple[int, Target], tuple[Any, Any]] = {}


def _params(fn: Any) -> tuple[Any, list[Any]]:
    """(signature, KernelParams) of a jit function; an interpreted one gets them built as
    ``JITFunction.__init__`` builds them, so both modes name a variant alike."""
    if hasattr(fn, "params") and hasattr(fn, "signature"):
        return fn.signature, fn.params
    import inspect

    from triton.runtime.jit import KernelParam

    sig = inspect.signature(fn.fn)
    kw = getattr(fn, "kwargs", {}) or {}
    dns = kw.get("do_not_specialize") or []
    dns_oa = kw.get("do_not_specialize_on_alignment") or []
    params = [KernelParam(i, p, i in dns or p.name in dns, i in dns_oa or p.name in dns_oa)
              for i, p in enumerate(sig.parameters.values())]
    return sig, params


def _bind(fn: Any, target: Target, args: Any, kwargs: dict[str, Any]) -> Any:
    """``(bound, specialization, options)`` as ``JITFunction.run`` computes them for
    ``target`` (with the ``debug`` and ``instrumentation_mode`` options it injects)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    cache_key = (id(fn), target)
    if cache_key not in _BINDERS:
        backend = make_backend(GPUTarget(*target))
        sig, params = _params(fn)
        _BINDERS[cache_key] = (backend, create_function_from_signature(sig, params, backend))
    _, binder = _BINDERS[cache_key]
    debug = getattr(fn, "debug", None)
    if debug is None:
        debug = (getattr(fn, "kwargs", {}) or {}).get("debug")
    kwargs["debug"] = kwargs.get("debug", debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    return binder(*args, **kwargs)


def current_target() -> Target:
    """The target Triton's JIT compiles for on this process's current GPU."""
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


# -- compiling (in a pool process) --------------------------------------------------------------
class _Ptr:
    """Stands in for a tensor: the dtype and the pointer residue Triton specializes on."""

    def __init__(self, dtype: Any, ptr_mod16: int):
        self.dtype = dtype
        self._ptr = ptr_mod16

    def data_ptr(self) -> int:
        return self._ptr


def _resolve(spec: LaunchSpec) -> Any:
    obj: Any = importlib.import_module(spec.module)
    for part in spec.qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _value(v: Any) -> Any:
    if isinstance(v, TensorArg):
        import torch

        return _Ptr(getattr(torch, v.dtype), v.ptr_mod16)
    return v


def compile_kernel(spec: LaunchSpec) -> Any:
    """Compile ``spec`` into the Triton cache as ``JITFunction.run`` would; the
    ``CompiledKernel``. Raises what the compiler raises."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import JITFunction

    fn = _resolve(spec)
    if not isinstance(fn, JITFunction):
        raise NotCompilable(f"{spec.name} is a {type(fn).__name__}, not a compiled-mode "
                          "JITFunction (TRITON_INTERPRET set?)")
    kwargs = {k: _value(v) for k, v in spec.constexprs}
    kwargs.update((k, _value(v)) for k, v in spec.options)
    bound, specialization, options = _bind(fn, spec.target,
                                           tuple(_value(a) for a in spec.args), kwargs)
    if spec.digest and _variant((spec.module, spec.qualname), specialization, options,
                                spec.target) != spec.digest:
        # the stand-ins did not specialize as the live arguments did: compiling this would
        # fill the cache under a key the timing process never asks for
        raise NotCompilable(f"{spec.name}: the shipped arguments specialize differently from "
                          "the launch's own")
    backend = _BINDERS[(id(fn), spec.target)][0]
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                         specialization, options)
    src = ASTSource(fn, signature, constexprs, attrs)
    return triton_compile(src, target=GPUTarget(*spec.target), options=options.__dict__)


_DRIVERS: dict[str, Any] = {}


def build_launcher(kernel: Any, target: Target) -> None:
    """Build ``kernel``'s host launcher into the cache with the backend's driver class
    (no device is touched; the driver library must be loadable). Raises when it cannot."""
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget

    t = GPUTarget(*target)
    for name, b in backends.items():
        if b.compiler.supports_target(t):
            if name not in _DRIVERS:
                _DRIVERS[name] = b.driver()
            _DRIVERS[name].launcher_cls(kernel.src, kernel.metadata)
            return
    raise NotCompilable(f"no Triton backend for {t}")


@dataclass
class CompileCounts:
    """Kernels ``triton.compile`` produced in this process while counting (through Triton's
    compilation listener; a listener installed before keeps being called)."""

    compiled: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    names: list[str] = field(default_factory=list)
    _previous: Any = None

    def start(self) -> CompileCounts:
        from triton import knobs

        self._previous = knobs.compilation.listener
        knobs.compilation.listener = self._listen
        return self

    def stop(self) -> CompileCounts:
        from triton import knobs

        if knobs.compilation.listener == self._listen:
            knobs.compilation.listener = self._previous
        return self

    def _listen(self, *, src: Any, metadata: Any, metadata_group: Any, times: Any,
                cache_hit: bool) -> None:
        if cache_hit:
            self.cache_hits += 1
        else:
            self.compiled += 1
            self.seconds += times.total / 1e6
            self.names.append(str(getattr(src, "name", "?")))
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, metadata_group=metadata_group,
                           times=times, cache_hit=cache_hit)


@contextmanager
def count_compiles() -> Iterator[CompileCounts]:
    """:class:`CompileCounts` of the calls inside the block."""
    counts = CompileCounts().start()
    try:
        yield counts
    finally:
        counts.stop()


def compile_spec(spec: LaunchSpec) -> Outcome:
    """The pool's compiler: :func:`compile_kernel`, then :func:`build_launcher`.

    A compile or resource error (the sweep's infeasible errors) is an infeasible outcome;
    anything else raised is a ``failed`` outcome that is not infeasible (the timing process
    compiles that kernel itself and the error surfaces there, as without a pool); a function
    that is not found in compiled mode is ``skipped``.
    """
    from kdispatch.tuning.verify import describe as one_line
    from kdispatch.tuning.verify import infeasible_errors

    t0 = time.monotonic()
    try:
        with count_compiles() as counts:
            kernel = compile_kernel(spec)
    except (ImportError, AttributeError, NotCompilable) as exc:
        return Outcome("skipped", one_line(exc), seconds=time.monotonic() - t0)
    except infeasible_errors() as exc:
        return Outcome("failed", one_line(exc), infeasible=True,
                       seconds=time.monotonic() - t0)
    except Exception as exc:  # noqa: BLE001 - reported; the timing process re-raises it
        return Outcome("failed", one_line(exc), seconds=time.monotonic() - t0)
    seconds = time.monotonic() - t0
    launcher = True
    try:
        build_launcher(kernel, spec.target)
    except Exception as exc:  # noqa: BLE001 - optional: the timing process builds it then
        launcher = False
        log.debug("launcher of %s not built ahead: %s", spec.name, one_line(exc))
    return Outcome("compiled", cache_hit=counts.cache_hits > 0 and not counts.compiled,
                   launcher=launcher, seconds=seconds)


def warm_up() -> None:
    """Import what a pool process's first kernel would (Triton's compiler, torch, the
    built-in op packages), so that kernel costs its compile alone. Best effort."""
    from kdispatch.registry import _builtin_modules

    for module in ("triton.compiler", "torch", "kdispatch.tuning.verify",
                   *_builtin_modules().values()):
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the item that needs it reports it
            log.debug("warm-up: %s not imported: %s", module, exc)


def load_compiler(path: str) -> Any:
    """The function a ``"module:function"`` path names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def default_workers(timing_processes: int = 1) -> int:
    """Pool processes: the CPU cores this process may use, less one per timing process."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores - timing_processes)
