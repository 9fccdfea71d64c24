"""tools/bench_flashmla.py and tools/flashmla_peer.sh on the CPU: the shapes it runs and
their order, the FLOP count (causal for several query tokens), and the clear failures
when the peer is not packed or built."""

import os
import subprocess
from pathlib import Path

import pytest

from tool_modules import tool

ROOT = Path(__file__).resolve().parents[1]


def test_shapes_come_in_the_order_given_exact_names_first():
    b = tool("bench_flashmla")
    got = [s.name for s in b.latent_shapes("deepseek-v3-tp1-mla-b32-c16384,ragged-b128-m4096")]
    assert got == ["deepseek-v3-tp1-mla-b32-c16384", "deepseek-v3-dp-ragged-b128-m4096",
                   "deepseek-v3-dp-ragged-b128-m4096-q2"]
    every = b.latent_shapes("")
    assert every and all(s.latent for s in every)
    assert {s.page for s in every if s.mean} == {64}


def test_flops_count_each_tokens_visible_length():
    b = tool("bench_flashmla")
    one = next(s for s in b.latent_shapes("deepseek-v3-tp1-mla-b32-c16384"))
    assert b.flops(one) == 2.0 * 128 * 32 * 16384 * (576 + 512)
    two = next(s for s in b.latent_shapes("deepseek-v3-tp1-mla-b32-c16384-q2"))
    assert b.flops(two) == 2.0 * 128 * 32 * (2 * 16384 - 1) * (576 + 512)


def test_a_missing_peer_build_names_the_command(tmp_path, monkeypatch):
    b = tool("bench_flashmla")
    monkeypatch.setattr(b, "PEER_BUILD", tmp_path / "build")
    with pytest.raises(SystemExit, match="flashmla_peer.sh build"):
        b.load_peer()


@pytest.mark.parametrize("args, msg", [([], "usage"), (["pack"], "FlashMLA git directory"),
                                       (["build"], "flashmla.tar.xz is missing")])
def test_the_peer_script_fails_with_one_line_naming_the_cause(args, msg, tmp_path):
    # a copy of the script in a scratch tree, so its .peers/ is empty
    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "flashmla_peer.sh"
    script.write_text((ROOT / "tools" / "flashmla_peer.sh").read_text())
    res = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                         env={**os.environ})
    assert res.returncode != 0 and msg in res.stderr, res.stderr
