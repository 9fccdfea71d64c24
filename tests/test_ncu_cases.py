"""tools/ncu_cases.py (the profiling driver; its runs need a GPU): case parsing and --help."""

import subprocess
import sys

import pytest

from tool_modules import TOOLS, tool


def test_write_cases_parse_and_bad_ones_name_the_case():
    nc = tool("ncu_cases")
    assert nc.parse_write("write:1,16,128") == (1, 16, 128, False)
    assert nc.parse_write("write:8,55,96,fp8") == (8, 55, 96, True)
    for bad in ("write:1,16", "write:a,16,128", "write:1,16,128,fp16", "wrote:1,16,128"):
        with pytest.raises(ValueError, match="expected write:tokens,heads,head_dim"):
            nc.parse_write(bad)


def test_help_runs_without_a_gpu():
    res = subprocess.run([sys.executable, str(TOOLS / "ncu_cases.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--case" in res.stdout, res.stderr
