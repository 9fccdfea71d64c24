"""The example package: its ops run, tune on the interpreter, ship a table, and become
visible to the CLI through the ``kdispatch.ops`` entry point alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import kdispatch
import kdispatch_example_ops as ex
from kdispatch.cli import main
from kdispatch.tables import read_table

HERE = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 1025])
def test_rmsnorm_matches_its_reference(dtype, tol, n):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(3, n, generator=g) + 0.25).to(dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(dtype)
    want = x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(ex.rmsnorm(x, w).float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 700])
def test_softmax_matches_torch(n):
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(ex.softmax(x), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)


def test_the_shipped_tables_serve_both_ops():
    e = kdispatch.explain("example.softmax", device="cpu-interpreter", dtype="float32",
                          n_cols=100)
    assert e.provenance == "table", e.consulted
    e = kdispatch.explain("example.rmsnorm", device="cpu-interpreter", x="float16",
                          n_cols=3000)
    assert e.provenance == "table", e.consulted
    table = read_table(HERE / "kdispatch_example_ops" / "tables" / "cpu-interpreter.json")
    assert {en.op for en in table.entries} == {"example.rmsnorm", "example.softmax"}


def test_a_key_nobody_tuned_gets_the_heuristic():
    e = kdispatch.explain("example.rmsnorm", device="nvidia-h200", x="float16", n_cols=8192)
    assert e.provenance == "heuristic" and e.config.BLOCK == 4096


def test_tune_and_export_the_example_ops_on_the_interpreter(tmp_path):
    db, out = str(tmp_path / "ex.sqlite"), tmp_path / "cpu-interpreter.json"
    runner = CliRunner()
    r = runner.invoke(main, ["tune", "--device", "cpu", "--op",
                             "example.rmsnorm,example.softmax", "--max-candidates", "3",
                             "--db", db])
    assert r.exit_code == 0, r.output
    assert "example.rmsnorm" in r.output and "example.softmax" in r.output
    r = runner.invoke(main, ["export", "--device", "cpu-interpreter", "--op",
                             "example.rmsnorm,example.softmax", "-o", str(out), "--db", db])
    assert r.exit_code == 0 and "exported 4 entries" in r.output, r.output
    r = runner.invoke(main, ["show", "--db", db, "--op", "example.softmax"])
    assert r.exit_code == 0 and "current" in r.output


def test_the_entry_point_alone_makes_the_ops_visible_to_the_cli(tmp_path):
    """A child process that never imports the package: the entry point declares the ops."""
    dist = tmp_path / "kdispatch_example_ops-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kdispatch-example-ops\n"
                                   "Version: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[kdispatch.ops]\n"
                                           "example.rmsnorm = kdispatch_example_ops:RMSNORM\n"
                                           "example.softmax = kdispatch_example_ops:SOFTMAX\n")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(HERE),
                                           os.environ.get("PYTHONPATH", "")]))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kdispatch.cli", *args], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)

    listing = cli("resolve", "--help")
    assert listing.returncode == 0 and "example.rmsnorm" in listing.stdout
    r = cli("resolve", "example.softmax", "--device", "cpu-interpreter", "--n-cols", "100",
            "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["provenance"] == "table"
    r = cli("resolve", "example.softmax", "--help")
    assert "--n-cols" in r.stdout and "Example" in r.stdout
