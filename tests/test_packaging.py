"""What a user pays before doing anything: import and --help load nothing heavy; the wheel
declares its license and its types."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pydantic", "sqlalchemy", "triton", "rich")


def _loaded_after(code: str) -> list[str]:
    probe = (f"{code}\nimport sys\n"
             f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    return [m for m in (lines[-1] if lines else "").split(",") if m]


def test_import_kdispatch_loads_no_heavy_module():
    assert _loaded_after("import kdispatch") == []


def test_cli_help_loads_no_heavy_module():
    code = ("from kdispatch.cli import main\n"
            "try:\n    main(['--help'], prog_name='kdispatch')\nexcept SystemExit:\n    pass")
    assert _loaded_after(code) == []


def test_the_package_is_typed_and_licensed():
    assert (ROOT / "kdispatch" / "py.typed").is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_the_wheel_carries_types_license_and_tables(tmp_path):
    res = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path),
                          str(ROOT)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = zipfile.ZipFile(next(tmp_path.glob("kdispatch-*.whl"))).namelist()
    assert "kdispatch/py.typed" in names and "kdispatch/db/nvidia-h200.json" in names
    assert "kdispatch/native/launch_cache.cpp" in names  # kdispatch build-ops compiles it
    assert any(n.endswith("licenses/LICENSE") for n in names)
