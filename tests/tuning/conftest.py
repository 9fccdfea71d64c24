"""Fixtures of the tuner tests."""

from __future__ import annotations

import pytest

from kdispatch.store import Store


@pytest.fixture
def store(tmp_path):
    """A fresh SQLite tuning database."""
    s = Store(f"sqlite:///{tmp_path / 'tune.sqlite'}")
    yield s
    s.dispose()
