"""torch.library registration of dispatched ops: one cheap ``Library`` per namespace.

Serving engines register their ops through ``torch.library.Library(...).impl`` rather than
``torch.library.custom_op`` (whose Python wrapper costs more per call than a whole
kernel launch): this module does the same for kdispatch's ops and for a package that
defines its own. Each op gets a CPU and a CUDA implementation (CPU tensors run under the
Triton interpreter) and a fake implementation, so ``torch.compile(fullgraph=True)`` and
CUDA-graph trees treat the call as one opaque op whose mutations the schema declares.

The ops are inference kernels without a derivative: each gets a fallthrough kernel at the
``Autograd`` key, so a call goes straight to its CPU or CUDA kernel instead of through
torch's autograd fallback (which checks every tensor argument and redispatches: ~4% of a
torch-op call's host cost). Their outputs never require grad, exactly as the public
functions' outputs (which launch the kernels directly) never do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from kdispatch.native import ops as native

_LIBS: dict[str, Any] = {}
_DEFINED: set[str] = set()
_lock = threading.Lock()


def define(namespace: str, schema: str, impl: Callable[..., Any],
           fake: Callable[..., Any], backends: tuple[str, ...] = ("CPU", "CUDA")) -> None:
    """Define ``namespace::<name>`` from ``schema`` with ``impl`` (at each of ``backends``)
    and ``fake``.

    Idempotent per qualified name (a module imported twice does not redefine its op).

    >>> import torch
    >>> define("kdispatch_doc", "twice(Tensor x) -> Tensor", lambda x: x * 2,
    ...        lambda x: torch.empty_like(x))
    >>> torch.ops.kdispatch_doc.twice(torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    import torch

    name = schema.split("(", 1)[0].strip()
    qualname = f"{namespace}::{name}"
    with _lock:
        if qualname in _DEFINED:
            return
        lib = _LIBS.get(namespace)
        if lib is None:
            lib = _LIBS[namespace] = torch.library.Library(namespace, "FRAGMENT")
        lib.define(schema)
        for backend in backends:
            lib.impl(name, impl, backend)
        lib.impl(name, torch.library.fallthrough_kernel, "Autograd")
        torch.library.register_fake(qualname, fake, lib=lib)
        _DEFINED.add(qualname)


def config_json(config: Any) -> str | None:
    """An op config as the JSON string a torch op takes (``None`` stays ``None``)."""
    if config is None:
        return None
    if hasattr(config, "model_dump_json"):
        return config.model_dump_json()
    import json

    return json.dumps(dict(config), sort_keys=True)


def add_kernel(namespace: str, name: str, impl: Callable[..., Any], backend: str) -> None:
    """Register ``impl`` for an op :func:`define` defined without ``backend``."""
    with _lock:
        _LIBS[namespace].impl(name, impl, backend)


def define_native(namespace: str, schema: str, impl: Callable[..., Any],
                  fake: Callable[..., Any], slow: Callable[..., Any],
                  tensor_args: Sequence[int]) -> None:
    """:func:`define` ``schema`` (an op's default overload) with the native launch cache's
    C++ kernel at CUDA where the library is loaded (:mod:`kdispatch.native`): the calls it
    cannot serve go to ``_<name>_slow``, a twin of the same schema whose CUDA kernel is
    ``slow`` (the Python path, which hands its launches to the cache). ``impl`` stays the
    CPU kernel, and the CUDA one where the library is not loaded or does not install;
    ``tensor_args`` are the positions of the call's tensors (what an entry checks)."""
    name = schema.split("(", 1)[0].strip()
    if not native.load():
        define(namespace, schema, impl, fake)
        return
    define(namespace, schema, impl, fake, backends=("CPU",))
    define(namespace, f"_{name}_slow" + schema[len(name):], slow, fake, backends=("CUDA",))
    if not native.install(f"{namespace}::{name}", f"{namespace}::_{name}_slow", tensor_args):
        add_kernel(namespace, name, impl, "CUDA")
