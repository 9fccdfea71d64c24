"""Tuning devices: the interpreter or a GPU, and the check that kernels match the mode.

Light on purpose (no torch, no pydantic until a device is resolved): the CLI asks it how
many devices a run has before it starts the compile pool, which should start at once."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kdispatch.device import Device
    from kdispatch.opdef import Op


class TuningError(RuntimeError):
    """The sweep cannot run as asked (no such device, interpreter mode mixed up, ...)."""


# -- devices -----------------------------------------------------------------------------------
def _kernel_modules_loaded() -> list[str]:
    return sorted(m for m in sys.modules
                  if m.startswith("kdispatch.kernels.") and m != "kdispatch.kernels._common")


def use_interpreter() -> None:
    """Select the Triton interpreter for this process (``TRITON_INTERPRET=1``).

    It must happen before any kernel module is imported (Triton decides at decoration).

    Raises
    ------
    TuningError
        When kernel modules were already imported in compiled mode.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    loaded = _kernel_modules_loaded()
    if loaded:
        raise TuningError(
            "--device cpu needs the Triton interpreter, but kernel modules were already "
            f"imported in compiled mode ({', '.join(loaded)}); set TRITON_INTERPRET=1 before "
            "importing kdispatch kernels, or run the tuner in a fresh process")
    os.environ["TRITON_INTERPRET"] = "1"


def check_kernel_mode(op: Op, interpreter: bool) -> None:
    """Raise TuningError if ``op``'s Triton kernels were built for the other mode."""
    for fn in op.kernels:
        kind = type(fn).__name__
        if interpreter and kind == "JITFunction":
            raise TuningError(f"{op.name}'s kernels were imported in compiled mode; --device "
                              "cpu needs TRITON_INTERPRET=1 before the kernels are imported")
        if not interpreter and kind == "InterpretedFunction":
            raise TuningError(f"{op.name}'s kernels were imported under TRITON_INTERPRET=1; "
                              "GPU tuning needs compiled kernels: unset TRITON_INTERPRET")


#: inputs a tuner may allocate on the CPU (the interpreter caps its inputs far below this)
CPU_INPUT_BYTES = 8 << 30


def input_budget(torch_device: Any) -> int:
    """Bytes of inputs one key may need on ``torch_device``: half a GPU's memory (a
    recorded key too large for the device is refused, not allocated)."""
    import torch

    dev = torch.device(torch_device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory // 2
    return CPU_INPUT_BYTES


def resolve_device(name: str) -> tuple[Device, Any]:
    """The dispatch device and torch device for ``"cpu"``, ``"auto"`` or ``"cuda:N"``.

    ``"cpu"`` selects the Triton interpreter (see :func:`use_interpreter`); its keys use the
    interpreter device and never mix with a GPU's.
    """
    import torch

    from kdispatch.device import Device

    name = name.strip().lower()
    if name in ("cpu", "interpreter", "cpu-interpreter"):
        use_interpreter()
        return Device.interpreter(), torch.device("cpu")
    if name == "auto" or name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise TuningError(f"device {name!r}: no CUDA/HIP GPU is available here; use "
                              "--device cpu to exercise the pipeline on the Triton interpreter")
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise TuningError("TRITON_INTERPRET=1 is set: GPU tuning needs compiled kernels")
        index = torch.cuda.current_device() if name in ("auto", "cuda") else None
        if index is None:
            try:
                index = int(name.split(":", 1)[1])
            except ValueError:
                raise TuningError(f"device {name!r}: expected cuda:N") from None
        if not 0 <= index < torch.cuda.device_count():
            raise TuningError(f"device {name!r}: this host has {torch.cuda.device_count()} GPUs")
        torch.cuda.set_device(index)
        tdev = torch.device("cuda", index)
        return Device.from_torch(tdev), tdev
    raise TuningError(f"device {name!r}: expected cpu, auto or cuda:N")


# -- device lists (--device all / cuda:0,cuda:1 / cpu,cpu) ------------------------------------
def is_multi_device(spec: str) -> bool:
    """Whether ``--device`` names several devices (``all`` or a comma-separated list)."""
    return spec.strip().lower() == "all" or "," in spec


def parse_devices(spec: str) -> list[str]:
    """Worker device names for ``--device all`` / ``cuda:0,cuda:1`` / ``cpu,cpu``.

    Parameters
    ----------
    spec : str
        ``"all"`` (every CUDA/HIP device of this host) or a comma-separated list of
        ``cuda:N`` (each at most once) or of ``cpu`` (any number of interpreter workers).

    Returns
    -------
    list of str
        Normalized names, ``"cuda:N"`` or ``"cpu"``.

    Raises
    ------
    TuningError
        No GPU for ``all``, an unknown or repeated GPU, or CPU and GPU mixed.
    """
    spec = spec.strip().lower()
    if spec == "all":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise TuningError("--device all: no CUDA/HIP GPU is available here; use "
                              "--device cpu,cpu to exercise the multi-process path")
        return [f"cuda:{i}" for i in range(count)]
    names = []
    for raw in (p.strip() for p in spec.split(",")):
        if not raw:
            continue
        if raw in ("cpu", "interpreter", "cpu-interpreter"):
            names.append("cpu")
        elif raw.startswith("cuda:") and raw[5:].isdigit():
            names.append(f"cuda:{int(raw[5:])}")
        else:
            raise TuningError(f"device {raw!r}: expected cpu or cuda:N in a device list")
    if not names:
        raise TuningError(f"--device {spec!r}: no devices named")
    if "cpu" in names and len(set(names)) > 1:
        raise TuningError("--device: do not mix cpu (the Triton interpreter) and GPUs in one "
                          "run; tune them separately")
    gpus = [n for n in names if n != "cpu"]
    if len(set(gpus)) != len(gpus):
        raise TuningError("--device: a GPU is listed twice; two tuners on one GPU would "
                          "disturb each other's timings")
    return names
