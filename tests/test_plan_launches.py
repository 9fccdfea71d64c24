"""tools/plan_launches.py's pieces that run without a GPU: its cases' inputs and its
config arguments (the timing itself needs CUDA graphs)."""

from __future__ import annotations

from kdispatch.kernels.decode_attention import spec
from tool_modules import tool


def test_full_and_ragged_inputs():
    pl = tool("plan_launches")
    full = pl.inputs(3, 128, False, device="cpu")
    assert full["seq_lens"].tolist() == [128] * 3
    assert full["block_table"].shape == (3, 2) and full["k_cache"].shape[1:] == (64, 1, 576)
    assert full["v_cache"].shape[-1] == 512 and full["q"].shape == (3, 128, 576)
    assert len(set(full["block_table"].flatten().tolist())) == 6  # distinct pages
    rag = pl.inputs(64, 128, True, seed=1, device="cpu")
    lens = rag["seq_lens"]
    assert rag["block_table"].shape == (64, 4)  # a table twice the context wide
    assert lens.min() >= 1 and lens.max() <= 256 and len(set(lens.tolist())) > 10


def test_configs_are_gluon_configs():
    pl = tool("plan_launches")
    got = pl.parse_configs(['s2={"num_kv_splits": 2}',
                            'pl1={"num_kv_splits": 1, "plan": true}'])
    assert got == {"s2": spec.gluon_config(2), "pl1": spec.gluon_config(1, plan=True)}
