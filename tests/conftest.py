"""Test set-up: the Triton interpreter on machines without a GPU, isolated databases."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any kdispatch kernel module is imported (Triton decorates then).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def dev() -> torch.device:
    """The device kernels run on in this session: cuda when present, else the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    """Every test gets its own database path and a fresh dispatcher and warning state."""
    from kdispatch import dispatcher, errors

    monkeypatch.setenv("KDISPATCH_DB", str(tmp_path / "kdispatch.sqlite"))
    for var in ("KDISPATCH_STRICT", "KDISPATCH_OVERRIDE", "KDISPATCH_RECORD_MISSES",
                "KDISPATCH_CU_NUM", "KDISPATCH_TABLE_DIR"):
        monkeypatch.delenv(var, raising=False)
    errors.reset_warnings()
    dispatcher.reset()
    yield
    dispatcher.reset()
