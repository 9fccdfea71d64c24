"""The Gluon MLA stage 1 on the CPU: it imports without a GPU, its TMA descriptors and launch
arguments cover the rows, and it compiles for sm_90a inside the shared-memory limit with no
spills in its two warpgroups (the seesaw's: within tools/gluon_mla_compile.py's budget)
(Gluon has no interpreter: its numbers are checked on the GPU by tools/gluon_mla_check.py,
through the dispatcher's launch path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdispatch.kernels.decode_attention import gluon_mla as G
from kdispatch.kernels.decode_attention.checks import q_dims

ROOT = Path(__file__).resolve().parents[2]


def _tool_env() -> dict:
    """The environment the compile tool runs in: no interpreter, the checkout importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _compile_reports(*args: str) -> list[dict]:
    """tools/gluon_mla_compile.py's JSON reports for ``args`` (it must exit 0)."""
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gluon_mla_compile.py"), *args],
                         check=False, capture_output=True, text=True, env=_tool_env(),
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def _tool_json(code: str, stdin: str):
    """The last JSON line ``code`` prints with the tool module imported as ``g`` (run in a
    subprocess: importing the tool here would clear TRITON_INTERPRET for the worker)."""
    code = "import json, sys; sys.path.insert(0, 'tools'); import gluon_mla_compile as g; " + code
    res = subprocess.run([sys.executable, "-c", code], input=stdin, check=False,
                         capture_output=True, text=True, env=_tool_env(), cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _inputs(b=2, h=64, pages=3, nb=8, page=64):
    q = torch.zeros(b, h, 576, dtype=torch.bfloat16)
    kv = torch.zeros(nb, page, 1, 576, dtype=torch.bfloat16)
    bt = torch.zeros(b, pages, dtype=torch.int32)
    sl = torch.ones(b, dtype=torch.int32)
    return q, kv, bt, sl


def test_descriptors_cover_the_rows():
    q, kv, _, _ = _inputs(b=3, h=128, nb=5)
    qd, qpd, kd, ped, _ = G.descriptors(q, kv)
    assert (qd.shape, qd.strides, qd.block_shape) == ([384, 512], [576, 1], [64, 512])
    assert (qpd.shape, qpd.block_shape) == ([384, 64], [64, 64])
    assert qpd.base.data_ptr() == q.data_ptr() + 512 * 2
    # a bf16 latent is copied in 64-column blocks (the seesaw's), an fp8 one whole
    assert (kd.shape, kd.strides, kd.block_shape) == ([320, 512], [576, 1], [64, 64])
    assert ped.base.data_ptr() == kv.data_ptr() + 512 * 2
    kd8 = G.descriptors(q, kv.to(torch.float8_e4m3fn))[2]
    assert (kd8.shape, kd8.block_shape) == ([320, 512], [64, 512])
    # a strided q (a slice of a wider tensor) is copied when its rows are not uniform
    wide = torch.zeros(3, 128, 640, dtype=torch.bfloat16)
    assert G.descriptors(wide[..., :576], kv)[0].strides == [640, 1]
    assert G.descriptors(torch.zeros(3, 256, 576, dtype=torch.bfloat16)[:, ::2],
                         kv)[0].strides == [1152, 1]
    heads_major = torch.zeros(128, 3, 576, dtype=torch.bfloat16).transpose(0, 1)
    qd, _, _, _, q2 = G.descriptors(heads_major, kv)
    assert qd.strides == [576, 1] and q2.is_contiguous()


@pytest.mark.parametrize("page", [16, 32])
def test_small_pages_are_page_row_boxes_of_a_64_token_tile(page):
    """A page is its own TMA box (``page`` rows) over ``num_pages * page`` cache rows; the
    tile stays 64 tokens (``BLOCK_N``), ``PAGE`` is the cache's page size."""
    q, kv, bt, sl = _inputs(b=3, h=128, nb=5, page=page)
    qd, _, kd, ped, _ = G.descriptors(q, kv)
    assert qd.block_shape == [64, 512]
    assert (kd.shape, kd.strides, kd.block_shape) == ([5 * page, 512], [576, 1], [page, 64])
    assert (ped.shape, ped.block_shape) == ([5 * page, 64], [page, 64])
    assert ped.base.data_ptr() == kv.data_ptr() + 512 * 2
    po, pl = torch.empty(3, 128, 2, 512), torch.empty(3, 128, 2)
    grid, args, kw = G.stage1_launch_args(q, kv, bt, sl, 0.1, 2, po, pl)
    assert kw["PAGE"] == page and kw["BLOCK_N"] == 64 and grid == (2, 3, 2)
    names = G._gluon_mla_stage1.arg_names
    got = dict(zip(names, args))
    assert got["max_len"] == bt.shape[1] * page and got["num_pages"] == 5
    # a padded row stride (pages still packed) is one descriptor stride
    wide = torch.zeros(5, page, 1, 640, dtype=torch.bfloat16)[..., :576]
    assert G.descriptors(q, wide)[2].strides == [640, 1]


def test_rows_of_several_tokens_are_one_view_in_request_token_head_order():
    """Row ``(b * QLEN + t) * H + h``; the grid covers ``cdiv(QLEN * H, 64)`` tiles a request
    and the partials rows ``H * QLEN`` (row ``head * QLEN + token``)."""
    b, t, h, s = 3, 2, 16, 4
    q = torch.zeros(b, t, h, 576, dtype=torch.bfloat16)
    kv = torch.zeros(5, 64, 1, 576, dtype=torch.bfloat16)
    assert q_dims(q) == (3, 2, 16, 576) and G.q_rows_uniform(q)
    qd, _, _, _, q2 = G.descriptors(q, kv)
    assert (qd.shape, qd.strides, qd.block_shape) == ([96, 512], [576, 1], [64, 512])
    assert q2 is q
    assert not G.q_rows_uniform(q.transpose(1, 2))  # head-major rows: copied
    assert G.descriptors(q.transpose(1, 2), kv)[4].is_contiguous()
    assert G.q_rows_uniform(torch.zeros(b, 1, h, 640, dtype=torch.bfloat16)[..., :576])
    po = torch.empty(b, t * h, s, 512)
    pl = torch.empty(b, t * h, s)
    grid, _, kw = G.stage1_launch_args(q, kv, torch.zeros(b, 2, dtype=torch.int32),
                                          torch.ones(b, dtype=torch.int32), 0.1, s, po, pl)
    assert grid == (1, b, s) and kw["QLEN"] == t
    grid, _, kw = G.stage1_launch_args(torch.zeros(b, 4, 128, 576, dtype=torch.bfloat16), kv,
                                       torch.zeros(b, 2, dtype=torch.int32),
                                       torch.ones(b, dtype=torch.int32), 0.1, s, po, pl)
    assert grid == (8, b, s) and kw["QLEN"] == 4


def test_the_seesaw_compiles_for_sm90a():
    """bf16 at 16-, 32- and 64-token pages: the seesaw (two 4-warp warpgroups at 240
    registers, the copy warp at 24), no serialized wgmma, the tile's MMAs of both
    warpgroups (88: each warpgroup's score MMA of its own tile in nine 64-column blocks,
    36, and the PV MMAs of both tiles on its half of the output, 8; warpgroup 1's PV MMA of
    B takes its P from registers), and no more spill bytes than the tool allows (written
    before the pair loop; with the stages' MMA descriptors formed before the loop,
    444-540 B)."""
    reps = _compile_reports("--splits", "2", "--rows", "128x1,16x2,12x2",
                            "--page", "16,32,64")
    assert sorted({r["page"] for r in reps}) == [16, 32, 64] and len(reps) == 9
    for rep in reps:
        assert rep["spill_store_bytes"] <= 160 and rep["shared_bytes"] <= 227 * 1024, rep
        assert rep["wgmma"] == 88 and not rep["serialized_wgmma_warning"], rep
        assert {24, 240} <= set(rep["register_limits"]), rep


def test_the_compile_tool_bounds_the_seesaw_and_the_other_forms_apart():
    """The seesaw's warpgroups may spill up to SEESAW_SPILL_LIMIT bytes; the other forms'
    warpgroups none, their copy warp up to COPY_WARP_SPILL_LIMIT."""
    seesaw = {"kv": "bf16", "page": 64, "warpgroup_spill_stores": 26}
    cases = [({**seesaw, "spill_store_bytes": 124}, False),
             ({**seesaw, "spill_store_bytes": 200}, True),
             ({**seesaw, "page": 16, "spill_store_bytes": 124}, False),
             ({"kv": "fp8", "page": 16, "warpgroup_spill_stores": 1,
               "spill_store_bytes": 20}, True),
             ({"kv": "fp8", "page": 64, "warpgroup_spill_stores": 0,
               "spill_store_bytes": 20}, False),
             ({"kv": "fp8", "page": 64, "warpgroup_spill_stores": 0,
               "spill_store_bytes": 40}, True)]
    reps = [{"regs": 168, "shared_bytes": 230000, **rep} for rep, _ in cases]
    got = _tool_json("print(json.dumps([g.failed(r) for r in json.load(sys.stdin)]))",
                     json.dumps(reps))
    assert got == [want for _, want in cases]


def test_the_compile_tool_attributes_spills_to_the_partition_that_makes_them():
    """ptxas reports one spill figure for a warp-specialized kernel; the tool attributes
    each spill store of the disassembly to the register limit set before it."""
    sass = "\n".join([
        "        /*0010*/                   STL [R1+0x4], R2 ;",
        "        /*0080*/                   USETMAXREG.DEALLOC.CTAPOOL 0x18 ;",
        "        /*01a0*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x20 ;",
        "        /*05f0*/                   STL.64 [R1+0x10], R4 ;",
        "        /*0600*/                   LDL.LU.64 R4, [R1+0x10] ;",
        "        /*2d70*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0 ;",
        "        /*3000*/                   STL.128 [R1+0x20], R8 ;",
        "        /*3010*/                   STL.64 [R1+0x30], R4 ;",
    ])
    by_limit, limits = _tool_json("t = sys.stdin.read(); print(json.dumps("
                                  "[g.spill_stores_by_limit(t, 168), g.register_limits(t)]))",
                                  sass)
    assert by_limit == {"168": 1, "32": 1, "240": 2} and limits == [24, 32, 240]


def test_the_compile_tool_flags_every_kind_of_serialized_wgmma():
    """ptxas serializes the warpgroup MMAs for several reasons, each its own warning number
    (C7514 when an instruction reads an in-flight accumulator: a PV MMA left in flight
    across the loop's back edge compiled to it in session 21; C7515 when one defines it):
    the tool reports any of them (it looked for C7515 alone before)."""
    logs = {
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions "
        "are serialized due to non wgmma instructions reading accumulator registers of  a "
        "wgmma between start and end of the pipeline stage in the function 'k'": True,
        "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions "
        "are serialized due to non wgmma instructions defining accumulator registers of a "
        "wgmma between start and end of the pipeline stage in the function 'k'": True,
        "ptxas info    : Used 226 registers, used 1 barriers": False,
    }
    got = _tool_json("print(json.dumps([g.wgmma_serialized(x) for x in json.load(sys.stdin)]))",
                     json.dumps(list(logs)))
    assert got == list(logs.values())


def test_the_fp8_latent_variant_compiles_without_spills():
    """The fp8 latent's variant (TMA'd e4m3 bytes converted per tile to one fp16 tile, q as
    fp16 in place, the scale tensors read): no spills in the same shared memory as bf16's
    (two fp8 ring stages and one fp16 tile where bf16 has two bf16 stages). Loading 16
    bytes a thread for the conversion compiled to 255 registers with 8-20 B of spills;
    8 bytes: 231-240 registers, none. Each page of the 64-token tile is its own pair of TMA
    copies (issued by the copy warp) at 16- and 32-token pages: the same MMAs (the form
    bf16 latents at those pages took before the seesaw served them)."""
    reps = _compile_reports("--splits", "2", "--rows", "128x1,16x2", "--page", "64,32,16",
                            "--kv", "fp8")
    assert sorted((r["kv"], r["page"], r["heads"]) for r in reps) == [
        ("fp8", 16, 16), ("fp8", 16, 128), ("fp8", 32, 16), ("fp8", 32, 128),
        ("fp8", 64, 16), ("fp8", 64, 128)]
    for rep in reps:
        assert rep["spill_store_bytes"] == 0 and rep["shared_bytes"] <= 227 * 1024, rep
        assert rep["wgmma"] == 40 and not rep["serialized_wgmma_warning"], rep


def test_the_narrow_fp8_tile_compiles_without_spills_through_its_launch_plan():
    """The narrow fp8 tile (``gluon_mla_narrow``), compiled from the launch plan of its
    config (12 and 16 heads, 8 heads x 2 tokens; 16- and 64-token pages; the balanced
    grid's length scan): no spill, within one program's shared memory (a 2-stage fp8 ring,
    two fp16 V tiles, q's two e4m3 parts), and ptxas does not serialize its warpgroup
    MMAs (the PV MMA of the tile before stays in flight only within a loop step)."""
    reps = _compile_reports("--narrow", "--kv", "fp8", "--splits", "4", "--rows",
                            "16x1,12x1,8x2", "--page", "16,64", "--balance")
    assert len(reps) == 6
    for rep in reps:
        assert rep["spill_store_bytes"] == 0 and rep["shared_bytes"] <= 227 * 1024, rep
        assert not rep["serialized_wgmma_warning"] and rep["wgmma"] > 0, rep


def test_the_gpu_check_tool_imports_and_shows_its_help():
    """tools/gluon_mla_check.py runs only on a GPU; here: it imports (the dispatcher's
    launch path it calls included) and its command line parses."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gluon_mla_check.py"), "--help"],
                         check=False, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(opt in res.stdout for opt in ("--phases", "--pages", "--time-pages", "--budget"))
