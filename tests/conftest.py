"""Test set-up: the Triton interpreter on machines without a GPU, isolated databases."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any kdispatch kernel module is imported (Triton decorates then).
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import interpreter_speed  # one language patch per launch: tests/interpreter_speed.py

    interpreter_speed.install()


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
    """Every test gets its own default database path (under a temporary XDG cache, never
    the user's), and a fresh dispatcher and warning state."""
    from kdispatch import dispatcher, errors

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("KDISPATCH_DB", "KDISPATCH_STRICT", "KDISPATCH_OVERRIDE", "KDISPATCH_RECORD_MISSES",
                "KDISPATCH_CU_NUM", "KDISPATCH_TABLE_DIR"):
        monkeypatch.delenv(var, raising=False)
    errors.reset_warnings()
    dispatcher.reset()
    yield
    dispatcher.reset()


@pytest.fixture
def runner():
    """click's CliRunner for the kdispatch command line."""
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def fake():
    """The tuner's test op (tests/tuning/fakeops.py) and its ``fake`` preset, registered."""
    import fakeops

    fakeops.install()
    yield fakeops.SPEC
    fakeops.uninstall()


PG_URL = os.environ.get("KDISPATCH_TEST_PG_URL", "")


def _fresh_pg_database(base_url: str) -> tuple[str, callable]:
    """A new empty PostgreSQL database on the test server; returns (url, drop)."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"kd_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(base_url).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh empty database URL: a SQLite file, and a PostgreSQL database when the test
    server is up (.ci/postgres starts one and exports KDISPATCH_TEST_PG_URL)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite'}"
        return
    if not PG_URL:
        pytest.skip("no PostgreSQL test server (KDISPATCH_TEST_PG_URL unset; CI starts one)")
    url, drop = _fresh_pg_database(PG_URL)
    try:
        yield url
    finally:
        drop()


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory: pytest.TempPathFactory):
    """A directory holding a fresh `kdispatch build-ops` build of the native launch cache
    (tests pass it to subprocesses as KDISPATCH_NATIVE_DIR)."""
    import subprocess
    import sys
    from pathlib import Path

    d = tmp_path_factory.mktemp("native")
    proc = subprocess.run([sys.executable, "-m", "kdispatch.cli", "build-ops"],
                          env={**os.environ, "KDISPATCH_NATIVE_DIR": str(d)},
                          capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("built ") and proc.stdout.split()[1].endswith(".so")
    return d
