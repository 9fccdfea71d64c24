"""Dispatch your own ``@triton.jit`` kernel: :func:`dispatch`, a drop-in for ``triton.autotune``.

``triton.autotune`` times every config in the serving process, on the first call of each
key, on whatever inputs that call brings, inside CUDA-graph capture if that is where the
first call happens. A kernel wrapped with :func:`dispatch` is launched the same way
(``kernel[grid](*args)``) but its config comes from the dispatch chain: a database row or a
shipped table tuned offline (``kdispatch tune --op NAME``, every candidate verified before it
is timed), else a heuristic, and nothing is ever timed while serving. The key is read from
argument values (ints) and tensor dtypes only, never tensor contents, so a resolve during
capture returns the same config at every replay.

>>> import triton, triton.language as tl
>>> @dispatch(name="doc.scale", key=["n"], configs=[Config({"BLOCK": 64}, num_warps=2),
...           Config({"BLOCK": 256}, num_warps=4)],
...           grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),))
... @triton.jit
... def scale(x, y, n, BLOCK: tl.constexpr):
...     i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
...     tl.store(y + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)
>>> scale.name, [c.BLOCK for c in scale.space]
('doc.scale', [64, 256])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import create_model

from kdispatch import dispatcher as _dispatch
from kdispatch.opdef import Op, OpConfig, OpKey, OpTuning, PlainArgs

KeyValue = int | float | bool | str


class Config:
    """A candidate launch config: constexpr values plus ``num_warps`` / ``num_stages``
    (the fields of ``triton.Config`` that a dispatched kernel uses)."""

    def __init__(self, kwargs: Mapping[str, Any] | None = None, num_warps: int = 4,
                 num_stages: int = 2):
        self.kwargs = dict(kwargs or {})
        self.num_warps = num_warps
        self.num_stages = num_stages

    @classmethod
    def of(cls, c: Any) -> Config:
        """A Config from a Config, a ``triton.Config`` or a mapping of fields."""
        if isinstance(c, Config):
            return c
        if isinstance(c, Mapping):
            rest = {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")}
            return cls(rest, c.get("num_warps", 4), c.get("num_stages", 2))
        return cls(getattr(c, "kwargs", {}), getattr(c, "num_warps", 4),
                   getattr(c, "num_stages", 2))

    def fields(self) -> dict[str, Any]:
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}


def _value_of(v: Any) -> KeyValue:
    """A key value: a tensor's dtype name, else the value itself."""
    if hasattr(v, "data_ptr") and hasattr(v, "dtype"):
        return str(v.dtype).removeprefix("torch.")
    if isinstance(v, bool | int | float | str):
        return v
    raise ValueError(f"key: cannot key on a {type(v).__name__}")


class _KernelTuning(OpTuning):
    """The tuning face of a :class:`KernelOp` (present when ``inputs=`` is given)."""

    def __init__(self, op: KernelOp, inputs: Callable[..., dict[str, Any]],
                 reference: Callable[[dict[str, Any]], Any] | None,
                 outputs: Sequence[str], tolerance: Any, bytes_moved: Any,
                 tune_keys: Sequence[Mapping[str, Any]]):
        self.op, self._inputs, self._reference = op, inputs, reference
        self.outputs = tuple(outputs)
        self._tolerance, self._bytes = tolerance, bytes_moved
        self._tune_keys = [dict(k) for k in tune_keys]

    def default_args(self) -> list[dict[str, Any]]:
        return self._tune_keys

    def candidates(self, key: Any) -> list[OpConfig]:
        return list(self.op.space)

    def make_inputs(self, key: Any, device: Any, seed: int) -> dict[str, Any]:
        return self._inputs(self.op.key_fields(key), device, seed)

    def run(self, config: Any, inputs: dict[str, Any]) -> Any:
        self.op.launch(config, **inputs)
        return tuple(inputs[n] for n in self.outputs)

    def launches(self, config: Any, inputs: dict[str, Any]) -> list[Any]:
        return [self.op.launch_of(config, inputs)]

    def reference(self, inputs: dict[str, Any]) -> Any:
        if self._reference is not None:
            return self._reference(inputs)
        # no reference given: the first config of the space, run on a copy, is the reference
        import torch

        copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        outs = self.run(self.op.space[0], copy)
        return tuple(o.float() for o in outs)

    def tolerance(self, key: Any) -> tuple[float, float]:
        t = self._tolerance
        return tuple(t(self.op.key_fields(key)) if callable(t) else t)  # type: ignore[return-value]

    def bytes_moved(self, key: Any) -> int:
        return int(self._bytes(self.op.key_fields(key))) if self._bytes else 0


class KernelOp(Op):
    """A ``@triton.jit`` kernel dispatched by key (see :func:`dispatch`)."""

    def __init__(self, fn: Any, *, name: str, key: Sequence[str], configs: Iterable[Any],
                 grid: Callable[[dict[str, Any]], tuple[int, ...]],
                 heuristic: Callable[[dict[str, Any]], Any] | None = None,
                 buckets: Mapping[str, Callable[[int], int]] | None = None,
                 tables: Iterable[str | Path] = (),
                 inputs: Callable[..., dict[str, Any]] | None = None,
                 reference: Callable[[dict[str, Any]], Any] | None = None,
                 outputs: Sequence[str] = (), tolerance: Any = (0.0, 0.0),
                 bytes_moved: Callable[[dict[str, Any]], int] | None = None,
                 tune_keys: Sequence[Mapping[str, Any]] = ()):
        self.fn = fn
        self.name = name  # type: ignore[misc]
        self.defining_module = fn.fn.__module__  # imported by tuning workers to register it
        self.params = list(inspect.signature(fn.fn).parameters)
        self.key_names = tuple(key)
        missing = [k for k in self.key_names if k not in self.params]
        if missing:
            raise ValueError(f"key: {', '.join(missing)} not among the kernel's arguments "
                             f"{self.params}")
        self._key_pos = tuple(self.params.index(k) for k in self.key_names)
        self.buckets = dict(buckets or {})
        cfgs = [Config.of(c) for c in configs]
        if not cfgs:
            raise ValueError("configs: at least one config is needed")
        names = sorted({k for c in cfgs for k in c.kwargs})
        fields = {n: (KeyValue, None) for n in names}
        self.config_model = create_model(  # type: ignore[misc]
            f"{name}.Config", __base__=OpConfig, num_stages=(int, 2), **fields)
        self.space = [self.config_model(**c.fields()) for c in cfgs]
        key_fields = {n: (KeyValue, ...) for n in self.key_names}
        self.key_model = create_model(f"{name}.Key", __base__=OpKey,  # type: ignore[misc]
                                      **key_fields)
        self.args_model = create_model(f"{name}.Args", __base__=PlainArgs,  # type: ignore[misc]
                                       **key_fields)
        self.grid = grid
        self._heuristic = heuristic
        self.kernels = (fn,)  # type: ignore[misc]
        self.launch_code = (grid,) if inspect.isfunction(grid) else ()  # type: ignore[misc]
        self.table_dirs = tuple(Path(t) for t in tables)  # type: ignore[misc]
        self.tuning = (_KernelTuning(self, inputs, reference, outputs, tolerance, bytes_moved,
                                     tune_keys) if inputs is not None else None)
        if inputs is not None and not outputs:
            raise ValueError("outputs: name the arguments the kernel writes, to verify them")

    # -- the op contract ---------------------------------------------------------------------
    def key_fields(self, key: Any) -> dict[str, Any]:
        return {n: getattr(key, n) for n in self.key_names}

    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        if self.is_plain(args):
            return tuple(args.items())
        return tuple(_value_of(args[n]) for n in self.key_names)

    def key(self, device: Any, args: Mapping[str, Any]) -> OpKey:
        values = {}
        for n in self.key_names:
            if n not in args:
                raise ValueError(f"{n}: required (a key argument of {self.name})")
            v = _value_of(args[n])
            bucket = self.buckets.get(n)
            values[n] = bucket(v) if bucket is not None and isinstance(v, int) else v
        return self.key_model(**OpKey.device_fields(device), **values)

    def heuristic(self, key: Any) -> OpConfig:
        if self._heuristic is None:
            return self.space[0]
        c = self._heuristic(self.key_fields(key))
        return c if isinstance(c, self.config_model) else \
            self.config_model(**Config.of(c).fields())

    def is_valid(self, key: Any, config: Any) -> bool:
        return config in self.space or (self._heuristic is not None
                                        and config == self.heuristic(key))

    def launch_of(self, config: Any, call_args: dict[str, Any]) -> Any:
        """The launch of ``config`` on ``call_args`` as data."""
        from kdispatch.launching import KernelLaunch

        cfg = config.model_dump()
        warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        consts = {k: v for k, v in cfg.items() if v is not None}
        args = tuple(call_args[n] for n in self.params if n in call_args)
        return KernelLaunch(self.fn, tuple(self.grid({**call_args, **consts})), args, consts,
                            {"num_warps": warps, "num_stages": stages})

    def launch(self, config: Any, **call_args: Any) -> Any:
        return self.launch_of(config, call_args).run()

    # -- the triton.autotune-style call ------------------------------------------------------
    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def run(self, *args: Any, grid: Any = None, **kwargs: Any) -> Any:
        """Resolve the config from the key arguments and launch ``fn[grid](...)``."""
        call = dict(zip(self.params, args))
        call.update(kwargs)
        cfg = _dispatch.dispatcher().resolve(self.name, call)
        fields = cfg.model_dump()
        warps, stages = fields.pop("num_warps"), fields.pop("num_stages")
        consts = {k: v for k, v in fields.items() if v is not None}
        meta = {**call, **consts}
        g = grid(meta) if callable(grid) else (grid if grid is not None else self.grid(meta))
        return self.fn[g](*args, **kwargs, **consts, num_warps=warps, num_stages=stages)


def dispatch(*, name: str, key: Sequence[str], configs: Iterable[Any],
             grid: Callable[[dict[str, Any]], tuple[int, ...]], **options: Any
             ) -> Callable[[Any], KernelOp]:
    """Wrap a ``@triton.jit`` kernel as a dispatched op and register it.

    Parameters
    ----------
    name : str
        The op's name (``"mypkg.rmsnorm"``): what ``kdispatch tune --op``, ``resolve``,
        ``show``, ``export`` and tables call it.
    key : list of str
        Kernel arguments whose values form the key (a tensor contributes its dtype).
    configs : list of Config, triton.Config or mapping
        The config space; the first is the default when no ``heuristic`` is given.
    grid : callable
        ``grid(meta) -> tuple``; ``meta`` holds the call's arguments and the config's
        constexprs (as a ``triton.autotune`` grid lambda does). A call may pass its own.
    heuristic : callable, optional
        ``heuristic(key_fields) -> Config``: the config when no tuned row or table has one.
    buckets : mapping, optional
        ``{arg: fn}`` rounding an int key argument (e.g. ``kdispatch.buckets.pow2_bucket``).
    tables : list of paths, optional
        Directories holding this op's shipped tables (``<device-key>.json``).
    inputs, reference, outputs, tolerance, bytes_moved, tune_keys : optional
        The tuning face: ``inputs(key_fields, device, seed) -> kernel arguments`` (random,
        never zeros), ``reference(inputs) -> tensor(s)`` (fp32; default: the first config's
        output), the names of the arguments the kernel writes, ``(atol, rtol)`` or a
        function of the key fields, ``bytes_moved(key_fields)``, and the plain-form keys
        ``kdispatch tune --op NAME`` tunes when no preset is named.
    """
    from kdispatch.registry import register

    def wrap(fn: Any) -> KernelOp:
        op = KernelOp(fn, name=name, key=key, configs=configs, grid=grid, **options)
        register(op, replace=True)
        return op

    return wrap
