"""tools/plan_launches.py's pieces that run without a GPU: its cases (bench_decode shapes)
and its config arguments (inputs and timing need CUDA)."""

from __future__ import annotations

from kdispatch.kernels.decode_attention import spec
from tool_modules import tool


def test_cases_are_bench_decode_shapes():
    pl = tool("plan_launches")
    full = pl.case_shape("full-b32:32,16384")
    assert (full.name, full.batch, full.hq, full.hk, full.dk, full.dv) == (
        "full-b32", 32, 128, 1, 576, 512)
    assert full.latent and full.page == 64 and full.lengths() == [16384] * 32
    rag = pl.case_shape("rag:64,128,rag")
    lens = rag.lengths()
    assert rag.context == 256 and rag.mean == 128  # a table twice the mean wide
    assert min(lens) >= 1 and max(lens) <= 256 and len(set(lens)) > 10


def test_configs_are_gluon_configs():
    pl = tool("plan_launches")
    got = pl.parse_configs(['s2={"num_kv_splits": 2}',
                            'pl1={"num_kv_splits": 1, "plan": true}'])
    assert got == {"s2": spec.gluon_config(2), "pl1": spec.gluon_config(1, plan=True)}
