"""The device model: what a dispatch key knows about the hardware.

A :class:`Device` is keyed on (vendor, arch, CU/SM count) plus a normalized
family key used to name shipped table files (``db/<key>.json``). Marketing names
are fragile (``NVIDIA H100 80GB HBM3`` vs ``H100``) and CU counts alone are
ambiguous (gfx950 and gfx1250 both report 256), so all of them are kept.

``KDISPATCH_CU_NUM`` overrides the CU count wherever a Device is built from the
environment (``from_torch``, ``from_key``), as aiter's ``CU_NUM`` does for
partitioned parts.
"""

from __future__ import annotations

import json
import logging
import os
import re
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kdispatch.paths import DEVICE_KEY_RE, check_device_key, find_table_file

log = logging.getLogger(__name__)

Vendor = Literal["nvidia", "amd", "intel", "triton"]

INTERPRETER_KEY = "cpu-interpreter"
CU_NUM_ENV = "KDISPATCH_CU_NUM"

_ARCH_RE = re.compile(r"^(sm_\d{2,3}a?|gfx[0-9a-f]{3,4}|interpreter|xe[a-z0-9_]*)$")


class Device(BaseModel):
    """One kind of accelerator, as the dispatcher keys it.

    Parameters
    ----------
    key : str
        Normalized family key, e.g. ``"nvidia-h200"``; names the shipped table file.
    vendor : {"nvidia", "amd", "intel", "triton"}
        ``"triton"`` is the CPU Triton interpreter.
    name : str
        Marketing name as the driver reports it, e.g. ``"NVIDIA H200"``.
    arch : str
        ``sm_90``, ``gfx942``, ... or ``interpreter``.
    cu_count : int
        Streaming multiprocessors (NVIDIA) or compute units (AMD).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    vendor: Vendor
    name: str = Field(min_length=1, max_length=128)
    arch: str
    cu_count: int = Field(ge=1, le=4096)

    @field_validator("key")
    @classmethod
    def _check_key(cls, v: str) -> str:
        if not DEVICE_KEY_RE.match(v):
            raise ValueError(f"device key {v!r} must be lowercase letters, digits and '-'")
        return v

    @field_validator("arch")
    @classmethod
    def _check_arch(cls, v: str) -> str:
        if not _ARCH_RE.match(v):
            raise ValueError(f"arch {v!r} is not of the form sm_NN, gfxNNN or interpreter")
        return v

    @property
    def is_interpreter(self) -> bool:
        return self.vendor == "triton"

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def interpreter(cls) -> Device:
        """The CPU Triton interpreter. Its tuned rows never mix with a GPU's (own key)."""
        return cls(key=INTERPRETER_KEY, vendor="triton", name="Triton interpreter",
                   arch="interpreter", cu_count=_cu_override(8))

    @classmethod
    def from_key(cls, key: str) -> Device:
        """A device from its family key, without that hardware present.

        Uses the device record of the shipped table ``db/<key>.json`` when one exists,
        else a built-in record. ``KDISPATCH_CU_NUM`` overrides the CU count.

        >>> Device.from_key("nvidia-h200").cu_count
        132
        >>> Device.from_key("amd-mi355x").arch
        'gfx950'
        """
        check_device_key(key)
        if key == INTERPRETER_KEY:
            return cls.interpreter()
        record = _record_for_key(key)
        cu = _cu_override(record.cu_count)
        return record if cu == record.cu_count else record.model_copy(update={"cu_count": cu})

    @classmethod
    def from_torch(cls, device: object = None) -> Device:
        """The device a torch device (``"cuda:0"``, ``torch.device``, index) runs on.

        CPU devices map to the interpreter. Cached per device index.
        """
        import torch

        dev = torch.device(device) if device is not None else torch.device("cuda")
        if dev.type == "cpu":
            return cls.interpreter()
        if dev.type != "cuda":
            raise ValueError(f"device: unsupported torch device type {dev.type!r}")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return _cuda_device(index, os.environ.get(CU_NUM_ENV, ""))

    @classmethod
    def current(cls) -> Device:
        """The current CUDA/HIP device, or the interpreter where there is none."""
        import torch

        if torch.cuda.is_available():
            return cls.from_torch(torch.cuda.current_device())
        return cls.interpreter()

    @classmethod
    def from_properties(cls, name: str, arch: str, cu_count: int, vendor: Vendor) -> Device:
        """Build a device from what a driver reports (name, arch, CU count)."""
        return cls(key=family_key(name, vendor), vendor=vendor, name=name, arch=arch,
                   cu_count=cu_count)


def family_key(name: str, vendor: str) -> str:
    """Normalize a marketing name into a family key.

    Memory-size and memory-type suffixes are dropped (they name the same part), but form
    factors that change the chip's limits (NVL, PCIe) are kept, so they never collide.

    >>> family_key("NVIDIA H100 80GB HBM3", "nvidia")
    'nvidia-h100'
    >>> family_key("NVIDIA H200", "nvidia")
    'nvidia-h200'
    >>> family_key("NVIDIA H200 NVL", "nvidia")
    'nvidia-h200-nvl'
    >>> family_key("NVIDIA GeForce RTX 5090", "nvidia")
    'nvidia-rtx-5090'
    >>> family_key("AMD Instinct MI300X", "amd")
    'amd-mi300x'
    """
    words = re.split(r"[^a-z0-9]+", name.lower())
    drop = {"", "nvidia", "amd", "intel", "geforce", "instinct", "radeon", "tesla", "sxm",
            "sxm4", "sxm5", "oam", "graphics", vendor}
    kept = [w for w in words
            if w not in drop and not re.fullmatch(r"\d+gb|hbm\d*e?|gddr\d+x?|\d+g", w)]
    if not kept:
        raise ValueError(f"device name {name!r} has no model in it")
    return "-".join([vendor, *kept])[:64]


# Built-in records for parts a table may target without the hardware present.
# CU counts: vendor specifications.
_BUILTIN: dict[str, Device] = {
    d.key: d for d in (
        Device(key="nvidia-h200", vendor="nvidia", name="NVIDIA H200", arch="sm_90", cu_count=132),
        Device(key="nvidia-h200-nvl", vendor="nvidia", name="NVIDIA H200 NVL", arch="sm_90",
               cu_count=132),
        Device(key="nvidia-h100", vendor="nvidia", name="NVIDIA H100 80GB HBM3", arch="sm_90",
               cu_count=132),
        Device(key="nvidia-h100-pcie", vendor="nvidia", name="NVIDIA H100 PCIe", arch="sm_90",
               cu_count=114),
        Device(key="nvidia-a100", vendor="nvidia", name="NVIDIA A100-SXM4-80GB", arch="sm_80",
               cu_count=108),
        Device(key="nvidia-rtx-5090", vendor="nvidia", name="NVIDIA GeForce RTX 5090",
               arch="sm_120", cu_count=170),
        Device(key="amd-mi300x", vendor="amd", name="AMD Instinct MI300X", arch="gfx942",
               cu_count=304),
        Device(key="amd-mi325x", vendor="amd", name="AMD Instinct MI325X", arch="gfx942",
               cu_count=304),
        Device(key="amd-mi355x", vendor="amd", name="AMD Instinct MI355X", arch="gfx950",
               cu_count=256),
    )
}


def builtin_keys() -> list[str]:
    return sorted(_BUILTIN)


#: a table's device record is read from its head; tables are capped far below this
_RECORD_READ_LIMIT = 64 << 20


def shipped_device_record(key: str) -> Device | None:
    """The device record of kdispatch's shipped table for ``key``, or None if absent or
    unreadable (the dispatcher reports unreadable tables; this never raises)."""
    path = find_table_file(key)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.loads(fh.read(_RECORD_READ_LIMIT))
        device = Device.model_validate(raw["device"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError, ValidationError) as exc:
        log.debug("no device record in %s: %s", path, exc)
        return None
    return device if device.key == key else None


def _record_for_key(key: str) -> Device:
    record = shipped_device_record(key)
    if record is not None:
        return record
    if key in _BUILTIN:
        return _BUILTIN[key]
    known = ", ".join(builtin_keys())
    raise ValueError(f"device: unknown device key {key!r}; known keys: {known}, "
                     f"{INTERPRETER_KEY}")


def _cu_override(default: int) -> int:
    raw = os.environ.get(CU_NUM_ENV, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{CU_NUM_ENV}={raw!r} is not an integer") from None
    if not 1 <= value <= 4096:
        raise ValueError(f"{CU_NUM_ENV}={value} is outside 1..4096")
    return value


@lru_cache(maxsize=64)
def _cuda_device(index: int, _cu_env: str) -> Device:
    """Properties of CUDA/HIP device ``index``; the env value is part of the cache key."""
    import torch

    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        vendor: Vendor = "amd"
        arch = props.gcnArchName.split(":")[0]
    else:
        vendor = "nvidia"
        arch = f"sm_{props.major}{props.minor}"
    device = Device.from_properties(props.name, arch, _cu_override(props.multi_processor_count),
                                    vendor)
    builtin = _BUILTIN.get(device.key)
    if builtin is not None and builtin.arch != device.arch:
        log.warning("device %s reports arch %s but the built-in record says %s; keeping %s",
                    device.name, device.arch, builtin.arch, device.arch)
    return device
