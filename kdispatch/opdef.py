"""What an op is to kdispatch: its key, its config and its two faces.

A dispatched op is an :class:`Op` (the *serving face*: key from shapes, an always-valid
heuristic, validity, the launch of an explicit config) with an optional :class:`OpTuning`
(the *tuning face*: candidates, random inputs, the fp32 reference, tolerance, bytes moved,
the baseline). Keys and configs are frozen pydantic models, so a hostile table row or
override is validated before it can reach a launch.

An op declares what its compiled code depends on: ``kernels`` (the ``@triton.jit``
functions it launches) and ``launch_code`` (the plain functions that turn a config into
constexprs and a grid). Their hash (:mod:`kdispatch.source_hash`) is what makes a tuned row
stale; comments and docstrings do not count.

Built-in ops live in ``kdispatch.kernels.<op>`` packages; another package registers its
own with :func:`kdispatch.register` or the ``kdispatch.ops`` entry point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

if TYPE_CHECKING:
    from kdispatch.device import Device

NUM_WARPS = (1, 2, 4, 8, 16)


class OpKey(BaseModel):
    """Base of every op key: the device fields. Subclasses add shape fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str = Field(min_length=1, max_length=64)
    vendor: str = Field(min_length=1, max_length=16)
    arch: str = Field(min_length=1, max_length=32)
    cu_count: int = Field(ge=1, le=4096)

    @staticmethod
    def device_fields(device: Device) -> dict[str, Any]:
        return {"device": device.key, "vendor": device.vendor, "arch": device.arch,
                "cu_count": device.cu_count}


#: key fields every op has (the device); the rest are the op's own
DEVICE_FIELDS = tuple(OpKey.model_fields)


class OpConfig(BaseModel):
    """Base of every launch config. Frozen; unknown fields are an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_warps: int = 4

    @field_validator("num_warps")
    @classmethod
    def _num_warps(cls, v: int) -> int:
        if v not in NUM_WARPS:
            raise ValueError(f"num_warps must be one of {NUM_WARPS}, got {v}")
        return v


class PlainArgs(BaseModel):
    """Base of an op's plain-form arguments (sizes as numbers, dtypes as names).

    Unknown arguments are an error that names them; the CLI's options are built from the
    fields (``--num-q-heads`` for ``num_q_heads``), with their descriptions as help.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")


def ladder(rungs: tuple[tuple[float, int], ...], x: float) -> int:
    """The value of the first ``(limit, value)`` rung with ``x <= limit`` (else the last).

    Heuristic thresholds are written as such ladders, each rung with the measurement that
    justified it.

    >>> ladder(((4096, 2), (1 << 30, 4)), 8192)
    4
    """
    for limit, value in rungs:
        if x <= limit:
            return value
    return rungs[-1][1]


def check_pow2(name: str, v: int, lo: int, hi: int) -> int:
    """Validate a block size: a power of two within [lo, hi]."""
    if v < lo or v > hi or v & (v - 1):
        raise ValueError(f"{name} must be a power of two in [{lo}, {hi}], got {v}")
    return v


def _tensor_sig(v: Any) -> Hashable:
    shape = getattr(v, "shape", None)
    if shape is not None and hasattr(v, "dtype"):
        return (tuple(shape), v.dtype, getattr(v, "device", None))
    return v


class Op(ABC):
    """The serving face of a dispatched op. Subclass it, or use :func:`kdispatch.dispatch`.

    Class attributes
    ----------------
    name : str
        Unique op name; dotted names (``"mypkg.rmsnorm"``) keep packages apart.
    key_model, config_model : type
        Subclasses of :class:`OpKey` and :class:`OpConfig`.
    args_model : type, optional
        A :class:`PlainArgs` subclass: the plain-form arguments (``resolve(op,
        device="nvidia-h200", ...)`` and the CLI's options).
    kernels : tuple
        The ``@triton.jit`` functions the op launches (hashed with every jit function they
        call and the constants they read).
    launch_code : tuple
        Plain functions that turn a config into constexprs, a grid and a kernel choice
        (hashed with the functions of the op's own package they call).
    table_dirs : tuple of paths
        Directories with this op's shipped tables (``<device-key>.json``).
    tuning : OpTuning or None
        The tuning face; None for an op that is resolved but never tuned.
    """

    name: ClassVar[str]
    key_model: ClassVar[type[OpKey]]
    config_model: ClassVar[type[OpConfig]]
    args_model: ClassVar[type[PlainArgs] | None] = None
    kernels: ClassVar[tuple[Any, ...]] = ()
    launch_code: ClassVar[tuple[Any, ...]] = ()
    table_dirs: ClassVar[tuple[str | Path, ...]] = ()
    tuning: OpTuning | None = None
    #: the names a tensor-form resolve accepts (None: any); the public resolve refuses
    #: others by name (the tuner's own input dicts, which hold more, call :meth:`key`)
    tensor_args: ClassVar[frozenset[str] | None] = None

    # -- resolution (host only: shapes, dtypes and devices; never device memory) ------------
    def is_plain(self, args: Mapping[str, Any]) -> bool:
        """Whether ``args`` is the plain form (a ``device=`` key and numbers, no tensors)."""
        return isinstance(args.get("device"), str) and not any(
            hasattr(v, "data_ptr") for v in args.values())

    def check_tensor_names(self, args: Mapping[str, Any]) -> None:
        """Raise ValueError naming an argument outside :attr:`tensor_args` in a call that
        gives tensors (a call without any is the plain form, which :meth:`plain_args`
        validates, ``device=`` a Device object included)."""
        if (self.tensor_args is not None and not self.tensor_args.issuperset(args)
                and any(hasattr(v, "data_ptr") for v in args.values())):
            unknown = sorted(set(args) - self.tensor_args)[0]
            raise ValueError(f"{unknown}: unknown argument of {self.name}'s tensor form "
                             f"(known: {', '.join(sorted(self.tensor_args))})")

    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        """A cheap hashable of exactly what :meth:`key` reads (override for speed)."""
        return tuple((k, _tensor_sig(v)) for k, v in args.items())

    #: optional: ``memo_guard(args)`` -> a cheaper ``check(later_args) -> bool`` that is
    #: True only where ``memo_key(later_args) == memo_key(args)``, or None (the public
    #: resolve's memo hit tries it first on the entry it served last)
    memo_guard: ClassVar[Callable[[Mapping[str, Any]], Callable[[Mapping[str, Any]], bool]
                                   | None] | None] = None

    def device_of(self, args: Mapping[str, Any]) -> Any:
        """The device ``args`` names: a tensor's device, a ``device=`` key, or None."""
        for v in args.values():
            dev = getattr(v, "device", None)
            if dev is not None and hasattr(v, "data_ptr"):
                return dev
        return args.get("device")

    def plain_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate plain-form ``args`` (without ``device``) against :attr:`args_model`."""
        rest = {k: v for k, v in args.items() if k != "device"}
        if self.args_model is None:
            return rest
        try:
            return self.args_model.model_validate(rest).model_dump()
        except ValidationError as exc:
            raise ValueError(_plain_error(exc)) from None

    @abstractmethod
    def key(self, device: Device, args: Mapping[str, Any]) -> OpKey:
        """The dispatch key of a tensor-form call, or of validated plain-form arguments."""

    @abstractmethod
    def heuristic(self, key: Any) -> OpConfig:
        """An always-valid config computed from the key alone."""

    def is_valid(self, key: Any, config: Any) -> bool:
        """Whether ``config`` may be served for ``key`` (tables, rows, overrides, pruning)."""
        return True

    def servable(self, key: Any, config: Any) -> bool:
        """Whether ``config`` may come from a table, a database row, an import or
        ``KDISPATCH_OVERRIDE`` (valid, and not a comparison-only baseline). An explicit
        ``config=`` argument needs only :meth:`is_valid`."""
        return self.is_valid(key, config)

    def check_config(self, key: OpKey, config: OpConfig, *, served: bool = False) -> None:
        """Raise ValueError if ``config`` must not be launched (or, with ``served``, served
        from a table, row, import or override) for ``key``."""
        if not self.is_valid(key, config):
            raise ValueError(f"config: {config!r} is not valid for {self.name} key {key!r}")
        if served and not self.servable(key, config):
            raise ValueError(f"config: {config!r} is a comparison-only baseline of "
                             f"{self.name}; it is never served from a table, row or override")

    # -- launching -------------------------------------------------------------------------
    @abstractmethod
    def launch(self, config: Any, **call_args: Any) -> Any:
        """Run the op with an explicit config."""

    # -- identity --------------------------------------------------------------------------
    def source_hash(self) -> str:
        """Hash of the code that decides the compiled kernels and their launch (16 hex)."""
        cached = self.__dict__.get("_source_hash")
        if cached is None:
            from kdispatch.source_hash import code_hash

            cached = code_hash(self.kernels, self.launch_code, salt=self.name)
            self.__dict__["_source_hash"] = cached
        return cached

    def parse_key(self, data: Mapping[str, Any]) -> OpKey:
        return self.key_model.model_validate(data)

    def parse_config(self, data: Mapping[str, Any]) -> OpConfig:
        return self.config_model.model_validate(data)


def _plain_error(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ())) or "arguments"
        msg = e.get("msg", "invalid")
        if e.get("type") == "extra_forbidden":
            msg = "unknown argument"
        elif e.get("type") == "missing":
            msg = "required"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)[:500]


class OpTuning(ABC):
    """The tuning face of an op: what the offline tuner needs, and nothing serving needs."""

    #: which ceiling a report sets the op's bandwidth against: "read" or "copy"
    ceiling: ClassVar[str] = "read"
    #: time this op's keys before other ops' keys of a tune (set by ops whose kernels
    #: compile in a fraction of a second: the GPU starts timing while the compile pool
    #: works on the larger kernels of the keys after them)
    time_first: ClassVar[bool] = False

    @abstractmethod
    def candidates(self, key: Any) -> Iterable[OpConfig]:
        """The search space for ``key`` (before pruning), most telling variants first."""

    @abstractmethod
    def make_inputs(self, key: Any, device: Any, seed: int) -> dict[str, Any]:
        """Random call arguments (never zeros) whose shapes map to ``key``."""

    @abstractmethod
    def run(self, config: Any, inputs: dict[str, Any]) -> Any:
        """Launch ``config`` on ``inputs`` and return the tensor(s) to verify."""

    @abstractmethod
    def reference(self, inputs: dict[str, Any]) -> Any:
        """The fp32 reference output for ``inputs`` (same structure as :meth:`run`)."""

    @abstractmethod
    def tolerance(self, key: Any) -> tuple[float, float]:
        """(atol, rtol) for comparing :meth:`run` with :meth:`reference`, by dtype."""

    def bytes_moved(self, key: Any) -> int:
        """Minimal bytes one call at ``key`` moves (for GB/s); 0 when not meaningful."""
        return 0

    def baseline(self, key: Any) -> OpConfig | None:
        """A config timed beside the candidates for comparison, never served."""
        return None

    def preset_args(self, model: Any) -> list[dict[str, Any]]:
        """Plain-form argument sets a model preset (:class:`~kdispatch.tuning.presets.
        ModelShape`) contributes for this op (none by default)."""
        return []

    def launches(self, config: Any, inputs: dict[str, Any]) -> list[Any]:
        """The :class:`~kdispatch.launching.KernelLaunch` list that :meth:`run` would launch
        for ``config`` on ``inputs``, without launching (lets the tuner compile candidates
        ahead, in parallel). An empty list: nothing to compile ahead."""
        return []

    def default_args(self) -> list[dict[str, Any]]:
        """Plain-form argument sets ``kdispatch tune --op NAME`` tunes when no preset is
        named (the op's own representative keys; none by default)."""
        return []
