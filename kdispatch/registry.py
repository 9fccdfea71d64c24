"""The op registry: each dispatched op declares a spec (key, config, space, heuristic, launcher).

An :class:`OpSpec` is the whole contract between an op and the machinery above it:

- ``key_model`` / ``config_model``: frozen pydantic models. Keys carry the device fields
  (``device``, ``vendor``, ``arch``, ``cu_count``) and the op's shape fields, with dynamic
  sizes bucketed by :mod:`kdispatch.buckets`. Configs validate their ranges on construction,
  so a hostile table row can never reach a launch.
- ``key(device, args)``: builds the key from the tensor form (only shapes, dtypes and the
  tensor's device are read) or the plain form (sizes as ints).
- ``memo_key(args)``: a cheap hashable of exactly what ``key`` reads, for the process memo.
- ``heuristic(key)``: an analytical config that is always valid (the mandatory default).
- ``candidates(key)`` and ``is_valid(key, config)``: the tuner's space and its pruning.
- ``launch(config, **call_args)``: the launcher, taking an explicit config.
- ``make_inputs`` / ``run`` / ``reference`` / ``tolerance`` / ``bytes_moved``: what the
  tuner needs to verify a candidate against the fp32 reference and to report bandwidth.

Kernel modules are imported lazily (see ``_BUILTIN_OPS``) so ``import kdispatch`` stays
cheap and the Triton interpreter can still be chosen before any kernel is decorated.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kdispatch.device import Device

DType = Literal["float32", "float16", "bfloat16"]
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


def _check_warps(v: int) -> int:
    if v not in NUM_WARPS:
        raise ValueError(f"num_warps must be one of {NUM_WARPS}, got {v}")
    return v


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


class OpConfig(BaseModel):
    """Base of every launch config. Frozen; unknown fields are an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_warps: int = 4

    @field_validator("num_warps")
    @classmethod
    def _num_warps(cls, v: int) -> int:
        return _check_warps(v)


class OpSpec(ABC):
    """Declares one dispatched op. See the module docstring for the contract."""

    name: ClassVar[str]
    key_model: ClassVar[type[OpKey]]
    config_model: ClassVar[type[OpConfig]]
    #: modules whose source defines the kernels; hashed into every stored row
    source_modules: ClassVar[tuple[str, ...]] = ()

    # -- resolution (host only, never touches device memory) ------------------------------
    @abstractmethod
    def memo_key(self, args: Mapping[str, Any]) -> Hashable:
        """Hashable of exactly what :meth:`key` reads from ``args`` (cheap: shapes, dtypes)."""

    @abstractmethod
    def key(self, device: Device, args: Mapping[str, Any]) -> OpKey:
        """The dispatch key for a tensor-form or plain-form call."""

    @abstractmethod
    def device_of(self, args: Mapping[str, Any]) -> Device | str | None:
        """The device named by ``args``: a tensor's device, a ``device=`` key, or None."""

    @abstractmethod
    def heuristic(self, key: OpKey) -> OpConfig:
        """An always-valid config computed from the key alone."""

    @abstractmethod
    def candidates(self, key: OpKey) -> Iterable[OpConfig]:
        """The tuner's search space for ``key`` (before pruning)."""

    def is_valid(self, key: OpKey, config: OpConfig) -> bool:
        """Whether ``config`` may be launched for ``key`` (pruning and table-load checks)."""
        return True

    def check_config(self, key: OpKey, config: OpConfig) -> None:
        """Raise ValueError if ``config`` must not be launched for ``key``."""
        if not self.is_valid(key, config):
            raise ValueError(f"config: {config!r} is not valid for {self.name} key {key!r}")

    # -- launching ------------------------------------------------------------------------
    @abstractmethod
    def launch(self, config: OpConfig, **call_args: Any) -> Any:
        """Run the op with an explicit config (the launcher)."""

    # -- tuning hooks ---------------------------------------------------------------------
    @abstractmethod
    def make_inputs(self, key: OpKey, device: Any, seed: int) -> dict[str, Any]:
        """Random call arguments (never zeros) whose shapes map to ``key``."""

    @abstractmethod
    def run(self, config: OpConfig, inputs: dict[str, Any]) -> Any:
        """Launch ``config`` on ``inputs`` and return the tensor(s) to verify."""

    @abstractmethod
    def reference(self, inputs: dict[str, Any]) -> Any:
        """The fp32 torch reference output for ``inputs`` (same structure as :meth:`run`)."""

    @abstractmethod
    def tolerance(self, key: OpKey) -> tuple[float, float]:
        """(atol, rtol) for comparing :meth:`run` with :meth:`reference`, by dtype."""

    @abstractmethod
    def bytes_moved(self, key: OpKey) -> int:
        """Minimal bytes one call at ``key`` moves (for GB/s)."""

    def baseline(self, key: OpKey) -> OpConfig | None:
        """The config the benchmarks call the baseline (split count 1, indexed writes)."""
        return None

    # -- identity -------------------------------------------------------------------------
    def source_hash(self) -> str:
        """sha256 (16 hex) over the source of ``source_modules``: a stored row's validity."""
        cached = getattr(self, "_source_hash", None)
        if cached is None:
            h = hashlib.sha256()
            for mod_name in self.source_modules:
                h.update(inspect.getsource(importlib.import_module(mod_name)).encode())
            cached = h.hexdigest()[:16]
            self._source_hash = cached
        return cached

    def parse_key(self, data: Mapping[str, Any]) -> OpKey:
        return self.key_model.model_validate(data)

    def parse_config(self, data: Mapping[str, Any]) -> OpConfig:
        return self.config_model.model_validate(data)


# name -> "module:attribute" of a spec instance; imported on first use.
_BUILTIN_OPS: dict[str, str] = {
    "kv_write": "kdispatch.kernels.kv_write_spec:SPEC",
    "decode_attention": "kdispatch.kernels.decode_attention:SPEC",
}
_LOADED: dict[str, OpSpec] = {}


def register(spec: OpSpec, *, replace: bool = False) -> OpSpec:
    """Register an op spec (tests register fakes this way)."""
    if not replace and (spec.name in _LOADED or spec.name in _BUILTIN_OPS):
        raise ValueError(f"op: {spec.name!r} is already registered")
    _LOADED[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _LOADED.pop(name, None)


def get_op(name: str) -> OpSpec:
    """The spec registered as ``name``; ValueError naming the known ops otherwise."""
    spec = _LOADED.get(name)
    if spec is not None:
        return spec
    target = _BUILTIN_OPS.get(name)
    if target is None:
        raise ValueError(f"op: unknown op {name!r}; known: {', '.join(op_names())}")
    module, attr = target.split(":")
    spec = getattr(importlib.import_module(module), attr)
    _LOADED[name] = spec
    return spec


def op_names() -> list[str]:
    return sorted(set(_BUILTIN_OPS) | set(_LOADED))
