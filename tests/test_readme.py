"""The README's set-up commands match CI, and its examples run."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_two_setup_commands_and_ci_runs_the_same_test_command():
    setup = _blocks("bash")[0].strip().splitlines()
    assert len(setup) == 2
    install, test_cmd = setup
    assert "pip install" in install and "kdispatch tune --device cpu" in install
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd.strip() in ci_lines
    assert "pytest" in test_cmd


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_examples_run(index, tmp_path):
    code = _blocks("python")[index]
    env = {**os.environ, "KDISPATCH_DB": str(tmp_path / "db.sqlite"), "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]


def test_cli_examples_name_real_commands_and_options():
    from click.testing import CliRunner

    from kdispatch.cli import main

    runner = CliRunner()
    for block in _blocks("bash")[1:]:
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("kdispatch "):
                continue
            argv = shlex.split(line)[1:]
            # resolve/explain take the op as a subcommand whose options are its arguments
            head = argv[:2] if argv[0] in ("resolve", "explain") else argv[:1]
            res = runner.invoke(main, [*head, "--help"])
            assert res.exit_code == 0, line
            for opt in (a.split("=")[0] for a in argv if a.startswith("-")):
                assert opt in res.output, f"{opt} of {line!r} is not an option"
