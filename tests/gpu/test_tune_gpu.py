"""Compiling ahead on the GPU: the same verdicts and best configs as compiling at launch, and
a timing process that loads every kernel from the pool's cache instead of compiling it.

Run on the device machine: ``python -m pytest tests/gpu/test_tune_gpu.py -q`` (two tuner
runs of the smoke preset in child processes, each with an empty Triton cache).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kdispatch.store import Store, digest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
#: two candidates within this fraction of each other are a tie (graph-replay noise on
#: microsecond kernels); a tie may go either way between two runs
TIE = 0.05


def _tune(tmp_path: Path, name: str, workers: int) -> tuple[Store, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / f"triton-{name}")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "250"
    db = f"sqlite:///{tmp_path / (name + '.sqlite')}"
    r = subprocess.run([sys.executable, "-m", "kdispatch.cli", "tune", "--device", "cuda:0",
                        "--preset", "smoke", "--max-candidates", "6", "--compile-workers",
                        str(workers), "--db", db], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return Store(db), r.stdout


def _verdicts(store: Store) -> dict:
    return {(m.op, m.key_digest, m.config_digest): m for m in store.measurements()}


def test_compiling_ahead_chooses_what_compiling_at_launch_chooses(tmp_path):
    plain, _ = _tune(tmp_path, "plain", 0)
    ahead, out = _tune(tmp_path, "ahead", 4)
    try:
        a, b = _verdicts(plain), _verdicts(ahead)
        assert set(a) == set(b)
        assert {k: m.status for k, m in a.items()} == {k: m.status for k, m in b.items()}
        # the timing process found every kernel in the cache the pool filled
        launch = re.search(r"(\d+) compiled at launch", " ".join(out.split()))
        assert launch is not None and launch.group(1) == "0", out[-2000:]
        best_a = {(r.op, r.key_digest): r for r in plain.best()}
        best_b = {(r.op, r.key_digest): r for r in ahead.best()}
        assert set(best_a) == set(best_b)
        for k, ra in best_a.items():
            rb = best_b[k]
            da, db = digest(ra.config), digest(rb.config)
            if da == db:
                continue
            # a tie: each run timed the other's choice within TIE of its own best
            other_in_a = a[(k[0], k[1], db)].median_us
            other_in_b = b[(k[0], k[1], da)].median_us
            assert other_in_a <= ra.median_us * (1 + TIE), json.dumps([ra.config, rb.config])
            assert other_in_b <= rb.median_us * (1 + TIE), json.dumps([ra.config, rb.config])
    finally:
        plain.dispose()
        ahead.dispose()
