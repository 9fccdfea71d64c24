"""The Gluon MLA stage 1 over the device-side work plan (``plan=True``, work_plan.py) on the
H200: ragged batches (empty requests, lengths around page and tile boundaries, one long
request among short ones) match the reference, bits stable run to run, and one captured
graph replayed over new lengths, tables and queries re-plans on the device each replay; a
batch of many short requests, whose persistent programs walk several segments each (odd
and even tile counts, q reloaded per segment), matches the reference."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from graph_capture import capture
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.decode_attention import reference_decode_attention
from kdispatch.kernels.decode_attention.launch import checked_plan
from kdispatch.kernels.decode_attention.spec import gluon_config

pytestmark = pytest.mark.gpu

DK, DV = 576, 512
FP8 = torch.float8_e4m3fn
LENS = [[0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 16384],
        [16383, 1, 1, 2, 64, 3, 4097, 0, 5, 65, 7, 8],
        [8192] * 12]


def _inputs(b, hq, q_len, ctx, page, seed, fp8_scale=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = -(-ctx // page)
    nb = b * pages + 3
    k = torch.randn(nb, page, 1, DK, device="cuda", generator=g)
    k = k.to(torch.bfloat16) if fp8_scale is None else quantize_fp8(k, fp8_scale, FP8)
    shape = (b, hq, DK) if q_len == 1 else (b, q_len, hq, DK)
    q = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
    bt = torch.randperm(nb, device="cuda", generator=g)[:b * pages].view(b, pages).int()
    return q, k, k[..., :DV], bt, g


@pytest.mark.parametrize("hq, q_len, page, splits, kv", [
    (128, 1, 64, 1, "bf16"), (128, 1, 16, 4, "bf16"), (16, 2, 16, 2, "bf16"),
    (128, 2, 64, 2, "bf16"), (128, 1, 64, 2, "fp8"), (16, 1, 32, 8, "bf16")])
def test_planned_batches_match_the_reference_and_replay(hq, q_len, page, splits, kv):
    b, ctx = len(LENS[0]), 16384
    ks = torch.full((1,), 0.02, device="cuda") if kv == "fp8" else None
    q, k, v, bt, g = _inputs(b, hq, q_len, ctx, page, hq + page + splits, ks)
    sl = torch.tensor(LENS[0], dtype=torch.int32, device="cuda")
    cfg = gluon_config(splits, plan=True)
    p = checked_plan(cfg, q, k, v, bt, sl, None, 0.0, ks)
    assert p.gluon and p.plan_parts > 0 and p.grid[1] == p.plan_parts
    scales = {} if ks is None else {"k_scale": ks, "v_scale": ks}
    kw = dict(scale=DK ** -0.5, config=cfg.model_dump(), **scales)
    first = kdispatch.decode_attention(q, k, v, bt, sl, **kw)
    assert torch.equal(first, kdispatch.decode_attention(q, k, v, bt, sl, **kw))
    ref = reference_decode_attention(q, k, v, bt, sl, scale=DK ** -0.5, **scales)
    torch.testing.assert_close(first.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert first[0].abs().max() == 0  # an empty request: no segment, zeros
    out = torch.empty_like(first)
    graph = capture(lambda: kdispatch.decode_attention(q, k, v, bt, sl, out=out, **kw),
                    forbid_sync=True)
    for i, lens in enumerate(LENS[1:] + LENS):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        if i >= 2:
            bt.copy_(torch.randperm(k.shape[0], device="cuda", generator=g)[:bt.numel()]
                     .view_as(bt).int())
        q.normal_(generator=g)
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_decode_attention(q, k, v, bt, sl, scale=DK ** -0.5, **scales)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kv, page, splits", [("bf16", 64, 1), ("bf16", 16, 2), ("fp8", 64, 1)])
def test_programs_walking_many_segments_match_the_reference(kv, page, splits):
    b, hq, ctx = 150, 128, 4096
    ks = torch.full((1,), 0.02, device="cuda") if kv == "fp8" else None
    q, k, v, bt, g = _inputs(b, hq, 1, ctx, page, 7 + page, ks)
    lens = torch.randint(0, ctx + 1, (b,), device="cuda", generator=g)
    lens[::7] = torch.tensor([1, 63, 64, 65, 0, 128, 129, 4096], device="cuda").repeat(4)[
        :lens[::7].numel()]
    sl = lens.int()
    cfg = gluon_config(splits, plan=True)
    scales = {} if ks is None else {"k_scale": ks, "v_scale": ks}
    out = kdispatch.decode_attention(q, k, v, bt, sl, scale=DK ** -0.5,
                                     config=cfg.model_dump(), **scales)
    ref = reference_decode_attention(q, k, v, bt, sl, scale=DK ** -0.5, **scales)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
