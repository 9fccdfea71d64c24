"""The decode torch op's native launches (torch_op.native_launches) pass what the Python
path launches, argument for argument: compared on the CPU with ``launches()`` (the launch
data the JIT path runs) for split, unsplit, merged and latent plans. The C++ packing of
these slots is tested in tests/torch/test_native_ops.py, the launches on the GPU in
tests/gpu/test_native_gpu.py."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest
import torch

import kdispatch
from kdispatch.kernels.decode_attention import launch as dlaunch
from kdispatch.kernels.decode_attention.torch_op import native_launches


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
    kdispatch.reset_dispatcher()


def _inputs(latent: bool, b: int = 3, page: int = 16, pages: int = 6):
    g = torch.Generator().manual_seed(0)
    if latent:  # the latent stage 1 (two half-width tiles) serves DV >= 512
        b, pages = 2, 2
        q = torch.randn(b, 16, 576, generator=g, dtype=torch.float16)
        kc = torch.randn(b * pages, page, 1, 576, generator=g, dtype=torch.float16)
        vc = kc[..., :512]
    else:
        q = torch.randn(b, 8, 32, generator=g, dtype=torch.float16)
        kc = torch.randn(b * pages, page, 2, 32, generator=g, dtype=torch.float16)
        vc = torch.randn(b * pages, page, 2, 32, generator=g, dtype=torch.float16)
    bt = torch.randperm(b * pages, generator=g).view(b, pages).int()
    sl = torch.tensor([1, 17, 65][:b], dtype=torch.int32)
    return q, kc, vc, bt, sl


def _slot(a, tensors, out, zeros, out_given):
    """The Python path's argument ``a`` as a native slot (what it must be packed as)."""
    if not isinstance(a, torch.Tensor):
        return a
    for i, t in enumerate(tensors):
        if a is t:
            return ("tensor", i)
    if a is out:
        return ("tensor", 5) if out_given else ("alloc", 0)
    if a is zeros:
        return ("ptr", zeros.data_ptr())
    first = 0 if out_given else 1  # the partials buffer's allocation: after the output's
    if a.dtype == torch.int32:
        return ("alloc", first + 1)  # the merge's zeroed counters
    return ("alloc", first, a.data_ptr())  # a view into the partials buffer: offset below


def _evaluate(arg, scale):
    if isinstance(arg, tuple) and arg[0] == "scalar":
        return float(scale) * arg[2]
    return arg


@pytest.mark.parametrize("out_given", [False, True], ids=["functional", "out"])
@pytest.mark.parametrize("latent,override", [
    (False, {"num_kv_splits": 4, "pdl": False, "merge": False}),
    (False, {"num_kv_splits": 1, "pdl": False, "merge": False}),
    (True, {"num_kv_splits": 4, "pdl": False, "merge": False, "block_h": 16}),
    (True, {"num_kv_splits": 4, "pdl": False, "merge": True, "block_h": 16}),
    (True, {"num_kv_splits": 1, "pdl": False, "merge": False, "block_h": 16}),
])
def test_native_launches_pass_the_python_paths_arguments(monkeypatch, latent, override,
                                                        out_given):
    monkeypatch.setenv("KDISPATCH_OVERRIDE", json.dumps({"decode_attention": override}))
    kdispatch.reset_dispatcher()
    q, kc, vc, bt, sl = tensors = _inputs(latent)
    scale = 0.125
    given = kdispatch.decode_attention(q, kc, vc, bt, sl, scale=scale)
    if out_given:  # the out= form's own entry
        kdispatch.decode_attention(q, kc, vc, bt, sl, scale=scale, out=given)
    else:
        given = None
    e = dlaunch.cached_entry(q, kc, vc, bt, sl, given)
    assert e is not None and e.plan.latent == latent
    assert e.config.num_kv_splits == override["num_kv_splits"]
    assert e.config.merge == override["merge"]
    p = e.plan
    # the interpreter keeps no direct launches: stand-ins with the plan's grids
    e.stage1 = NS(compiled=None, function=0, g0=p.grid[0], g1=p.grid[1], g2=p.grid[2])
    e.reduce = (None if p.reduce_grid is None else
                NS(compiled=None, function=0, g0=p.reduce_grid[0], g1=p.reduce_grid[1],
                   g2=p.reduce_grid[2]))
    native, allocs = native_launches(e, q.dtype, out_given)
    out = given if out_given else q.new_empty(p.out_shape)
    jit = dlaunch.launches(p, q, kc, vc, bt, sl, out, scale, 0.0, e.window, None, None,
                           e.zeros)
    assert len(native) == len(jit) == (1 if p.reduce_grid is None else 2)
    if not out_given:
        assert allocs.pop(0) == (p.out_shape, q.dtype, False)
    assert (len(allocs) > 0) == (p.partials_shape is not None)
    if p.partials_shape is not None:
        assert allocs[0] == ((e.tail2[0],), torch.float32, False)
        assert (len(allocs) == 2) == (p.counters_shape is not None)
    for nat, data in zip(native, jit):
        assert tuple(nat.grid) == tuple(data.grid) + (1,) * (3 - len(data.grid))
        want = [_slot(a, tensors, out, e.zeros, out_given) for a in data.args]
        base = min((w[2] for w in want if isinstance(w, tuple) and len(w) == 3),
                   default=0)
        want = [(w[0], w[1]) if isinstance(w, tuple) and len(w) == 3 and w[2] == base
                else (w[0], w[1], w[2] - base) if isinstance(w, tuple) and len(w) == 3
                else w for w in want]
        got = [_evaluate(a, scale) for a in nat.args]
        assert got == want
