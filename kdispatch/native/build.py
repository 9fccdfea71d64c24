"""Building and loading the native launch cache (``launch_cache.cpp``).

The library is built once per machine by ``kdispatch build-ops`` (a C++ compiler, no CUDA
toolkit: the driver types come from the ``cuda.h`` Triton ships) into
``$XDG_CACHE_HOME/kdispatch/native`` (``KDISPATCH_NATIVE_DIR`` overrides), under a name
that holds a digest of the source, torch's version and the C++ ABI, so a torch upgrade or a
new kdispatch never loads a stale build. kdispatch loads it at import when it exists, unless
``KDISPATCH_FAST_OPS=0``; a library that fails to load leaves the Python path in place with
one warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from kdispatch.errors import KDispatchWarning
from kdispatch.settings import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("launch_cache.cpp")
NATIVE_DIR_ENV = "KDISPATCH_NATIVE_DIR"
FAST_OPS_ENV = "KDISPATCH_FAST_OPS"
NAMESPACE = "kdispatch_native"


class NativeBuildError(RuntimeError):
    """The native library could not be built (its message is one line naming the cause)."""


def enabled() -> bool:
    """False when ``KDISPATCH_FAST_OPS=0`` (every torch op then takes the Python path)."""
    return os.environ.get(FAST_OPS_ENV, "1").strip() != "0"


def library_dir() -> Path:
    env = os.environ.get(NATIVE_DIR_ENV)
    return Path(env) if env else cache_dir() / "native"


def _abi() -> str:
    import torch

    return f"{torch.__version__}-cxx11abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}-{sys.platform}"


def library_path() -> Path:
    """Where the build for this source and this torch lives."""
    digest = hashlib.sha256(SOURCE.read_bytes() + _abi().encode()).hexdigest()[:16]
    return library_dir() / f"kdispatch_native-{digest}.so"


def _cuda_include() -> Path:
    import triton

    inc = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    if not (inc / "cuda.h").is_file():
        raise NativeBuildError(f"Triton's cuda.h is missing (looked in {inc})")
    return inc


def compile_command(out: Path) -> list[str]:
    """The compiler command that builds the library into ``out``."""
    import torch
    from torch.utils import cpp_extension

    cxx = shlex.split(os.environ.get("CXX") or "c++")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{_cuda_include()}"]
    lib_dirs = cpp_extension.library_paths()
    return [*cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *includes, str(SOURCE), "-o", str(out),
            *[f"-L{d}" for d in lib_dirs], *[f"-Wl,-rpath,{d}" for d in lib_dirs],
            "-lc10", "-ltorch_cpu", "-ltorch", "-ldl"]


def build(force: bool = False) -> Path:
    """Build the library unless this source's build for this torch exists; its path.

    The compiler writes a temporary file that is renamed into place, so builds running at
    the same time never leave a partial library.
    """
    path = library_path()
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        cmd = compile_command(Path(tmp))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError as e:
            raise NativeBuildError(f"no C++ compiler: {cmd[0]} was not found (set CXX)") from e
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln),
                         proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
            raise NativeBuildError(f"the compiler failed ({cmd[0]}): {first.strip()}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_LOCK = threading.Lock()
_LOADED: Path | None = None
_FAILED = False


def load() -> bool:
    """Load the built library into this process (once); False when it is disabled, not
    built, or fails to load (then one warning says why and the Python path stays)."""
    global _LOADED, _FAILED
    if _LOADED is not None:
        return True
    if _FAILED or not enabled():
        return False
    with _LOCK:
        if _LOADED is not None:
            return True
        path = library_path()
        if not path.is_file():
            return False
        try:
            import torch

            torch.ops.load_library(str(path))
        except Exception as e:  # noqa: BLE001 - never break an import over the fast path
            _FAILED = True
            warnings.warn(f"kdispatch: the native launch cache {path} failed to load "
                          f"({type(e).__name__}: {e}); the torch ops take the Python path "
                          "(rebuild with `kdispatch build-ops`)", KDispatchWarning, stacklevel=2)
            return False
        _LOADED = path
        log.debug("loaded the native launch cache %s", path)
        return True


def loaded() -> Path | None:
    """The loaded library's path, or None."""
    return _LOADED


def ops() -> Any:
    """``torch.ops.kdispatch_native`` (after :func:`load`)."""
    import torch

    return getattr(torch.ops, NAMESPACE)
