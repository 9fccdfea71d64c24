"""What a stored row records about where it was measured: the toolchain, the process."""

from __future__ import annotations

import os
import sys


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def toolchain_versions() -> dict[str, str]:
    """Versions that invalidate a measurement: kdispatch, torch, triton (read from the
    installed distributions, so asking costs no torch import)."""
    from importlib.metadata import PackageNotFoundError, version

    from kdispatch._version import __version__

    out = {"kdispatch": __version__}
    for dist in ("torch", "triton"):
        mod = sys.modules.get(dist)
        if mod is not None and getattr(mod, "__version__", None):
            out[dist] = str(mod.__version__)  # what the running kernels were built with
            continue
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:  # pragma: no cover - both are dependencies
            out[dist] = "none"
    return out
