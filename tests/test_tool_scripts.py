"""The shell scripts of tools/ (run on the device machine) at least parse."""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "tools").glob("*.sh"))


def test_there_are_scripts():
    assert {"gpu_session.sh", "gpu_trial.sh", "bench_tune.sh"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_parses(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_gpu_trial_needs_its_reference_trees(tmp_path):
    script = next(p for p in SCRIPTS if p.name == "gpu_trial.sh")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert res.returncode != 0 and "REFS" in res.stderr
