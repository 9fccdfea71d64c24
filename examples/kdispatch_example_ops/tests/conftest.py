"""The example's tests run on the Triton interpreter where there is no GPU, each with its
own kdispatch database path and a fresh dispatcher."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is decorated


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    import kdispatch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for var in ("KDISPATCH_DB", "KDISPATCH_TABLE_DIR", "KDISPATCH_OVERRIDE", "KDISPATCH_STRICT"):
        monkeypatch.delenv(var, raising=False)
    kdispatch.reset_dispatcher()
    yield
    kdispatch.reset_dispatcher()
