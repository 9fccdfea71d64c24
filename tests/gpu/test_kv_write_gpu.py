"""kv_write on the GPU: CUDA-graph capture and replay, no indexed assignment, >2^31-element caches.

Run on the device machine: ``python -m pytest tests/gpu/test_kv_write_gpu.py -q``.
(The interpreter tests in tests/kernels/test_kv_write.py also run on the GPU there.)
"""

from __future__ import annotations

import pytest
import torch

import kdispatch
from graph_capture import capture
from kdispatch.kernels.kv_write import KVWriteConfig, reference_kv_write

pytestmark = pytest.mark.gpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MASKINGS = ("none", "row_mask", "active_rows", "both")
T, H, D, PAGE, BLOCKS = 24, 4, 128, 16, 32


def _rand_(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill ``t`` in place with values in +-[0.25, 1.25] (random, never zero)."""
    x = torch.rand(t.shape, generator=gen, device=t.device) * 2 - 1
    return t.copy_(x + torch.where(x >= 0, 0.25, -0.25))


def _slots(gen: torch.Generator, n: int, num_slots: int, negative: int) -> torch.Tensor:
    """Unique slots, never the first or last one (refill places those explicitly)."""
    s = torch.randperm(num_slots - 2, generator=gen, device="cuda")[:n] + 1
    if negative:
        s[torch.randperm(n, generator=gen, device="cuda")[:negative]] = -1
    return s


class GraphCase:
    """Static input buffers of one captured write, refilled in place before each replay."""

    def __init__(self, dtype: torch.dtype, masking: str, seed: int = 0):
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        hd = H * D
        self.qkv = _rand_(torch.empty(T, 3 * hd, dtype=dtype, device="cuda"), self.gen)
        self.key = self.qkv[:, hd:2 * hd].view(T, H, D)
        self.value = self.qkv[:, 2 * hd:].view(T, H, D)
        self.key_cache = _rand_(torch.empty(BLOCKS, PAGE, H, D, dtype=dtype, device="cuda"),
                                self.gen)
        # V cache with another layout: [blocks, heads, page, dim] viewed as the flash layout
        self.value_cache = _rand_(torch.empty(BLOCKS, H, PAGE, D, dtype=dtype, device="cuda"),
                                  self.gen).permute(0, 2, 1, 3)
        self.slot_mapping = _slots(self.gen, T, BLOCKS * PAGE, 3)
        self.row_mask = (torch.ones(T, dtype=torch.bool, device="cuda")
                         if masking in ("row_mask", "both") else None)
        self.active_rows = (torch.full((1,), T, dtype=torch.int32, device="cuda")
                            if masking in ("active_rows", "both") else None)

    def args(self) -> dict:
        return {"key": self.key, "value": self.value, "key_cache": self.key_cache,
                "value_cache": self.value_cache, "slot_mapping": self.slot_mapping,
                "row_mask": self.row_mask, "active_rows": self.active_rows}

    def refill(self, step: int) -> None:
        """New values, slots (some negative), mask and active count: in place."""
        _rand_(self.qkv, self.gen)
        self.slot_mapping.copy_(_slots(self.gen, T, BLOCKS * PAGE, step % 4))
        if step == 1:  # the first and the last slot of the cache
            self.slot_mapping[0], self.slot_mapping[-1] = 0, BLOCKS * PAGE - 1
        if self.row_mask is not None:
            self.row_mask.copy_(torch.rand(T, generator=self.gen, device="cuda") < 0.7)
        if self.active_rows is not None:
            self.active_rows.fill_((0, T, 7, 100, 1, 13)[step % 6])


_capture = capture


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_graph_replay_follows_new_inputs(dtype, masking):
    case = GraphCase(dtype, masking)
    cfg = kdispatch.resolve("kv_write", **case.args())
    assert cfg.variant == "fused"
    graph = _capture(lambda: kdispatch.write_kv(**case.args(), config=cfg))
    wrote = 0
    for step in range(6):
        case.refill(step)
        ref_k, ref_v = reference_kv_write(**case.args())
        wrote += not torch.equal(ref_k, case.key_cache.float())  # this replay must write
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(case.key_cache.float(), ref_k), step
        assert torch.equal(case.value_cache.float(), ref_v), step
    assert wrote >= 4


def _forbid_indexed_assignment(mp) -> None:
    def boom(*_a, **_k):
        raise AssertionError("indexed assignment on the ordinary kv_write path")

    for name in ("__setitem__", "index_put_", "index_put", "index_copy_", "scatter_"):
        mp.setattr(torch.Tensor, name, boom)
    mp.setattr(torch, "index_put", boom)


def test_ordinary_graph_path_uses_no_indexed_assignment(monkeypatch):
    case = GraphCase(torch.bfloat16, "none", seed=1)
    with monkeypatch.context() as mp:
        _forbid_indexed_assignment(mp)
        graph = _capture(lambda: kdispatch.write_kv(**case.args()))  # resolve inside capture
    case.refill(2)
    ref_k, ref_v = reference_kv_write(**case.args())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(case.key_cache.float(), ref_k)
    assert torch.equal(case.value_cache.float(), ref_v)
    # and the baseline really is indexed assignment: the patch catches it
    with monkeypatch.context() as mp:
        _forbid_indexed_assignment(mp)
        with pytest.raises(AssertionError, match="indexed assignment"):
            kdispatch.write_kv(**{**case.args(), "slot_mapping": case.slot_mapping.abs()},
                               config=KVWriteConfig(variant="indexed"))


def test_ordinary_path_launches_one_fused_kernel():
    case = GraphCase(torch.bfloat16, "none", seed=2)
    kdispatch.write_kv(**case.args())  # compile
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        kdispatch.write_kv(**case.args())
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert sum("_kv_write_kernel" in n for n in names) == 1, names
    assert not any(w in n.lower() for n in names for w in ("index", "scatter")), names


def test_resolve_and_launch_do_not_sync():
    case = GraphCase(torch.bfloat16, "both", seed=3)
    cfg = kdispatch.resolve("kv_write", **case.args())
    kdispatch.write_kv(**case.args(), config=cfg)  # compile first: compilation is not serving
    torch.cuda.synchronize()
    kdispatch.reset_dispatcher()
    case.refill(3)
    ref_k, ref_v = reference_kv_write(**case.args())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        kdispatch.write_kv(**case.args())  # fresh dispatcher: full resolve, then launch
        kdispatch.write_kv(**case.args())  # memo hit
        resolved = kdispatch.resolve("kv_write", **case.args())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert resolved == cfg
    assert torch.equal(case.key_cache.float(), ref_k)
    assert torch.equal(case.value_cache.float(), ref_v)


def test_cache_over_2_pow_31_elements():
    heads, dim, page = 8, 128, 16
    per_block = page * heads * dim
    blocks = (1 << 31) // per_block + 8  # 2^31 + 131072 elements per cache (4.3 GB bf16)
    num_slots = blocks * page
    gen = torch.Generator(device="cuda").manual_seed(4)
    key_cache = torch.empty(blocks, page, heads, dim, dtype=torch.bfloat16, device="cuda")
    value_cache = torch.empty_like(key_cache)
    for cache in (key_cache, value_cache):
        for chunk in cache.split(8192):
            _rand_(chunk, gen)
    assert key_cache.numel() > 1 << 31
    n = 16
    first_high = (1 << 31) // (heads * dim)  # first slot whose offset is >= 2^31 elements
    slots = torch.tensor([num_slots - 1, first_high, first_high - 1, 0]
                         + list(range(num_slots - 13, num_slots - 1)), device="cuda")
    assert len(slots) == n and len(slots.unique()) == n
    qkv = _rand_(torch.empty(n, 3 * heads * dim, dtype=torch.bfloat16, device="cuda"), gen)
    key = qkv[:, heads * dim:2 * heads * dim].view(n, heads, dim)
    value = qkv[:, 2 * heads * dim:].view(n, heads, dim)
    row_mask = torch.ones(n, dtype=torch.bool, device="cuda")
    row_mask[5] = False
    expect_k, expect_v = key_cache.clone(), value_cache.clone()
    keep = row_mask.nonzero().flatten()
    expect_k[slots[keep] // page, slots[keep] % page] = key[keep]
    expect_v[slots[keep] // page, slots[keep] % page] = value[keep]
    kdispatch.write_kv(key, value, key_cache, value_cache, slots, row_mask=row_mask)
    torch.cuda.synchronize()
    assert torch.equal(key_cache, expect_k)
    assert torch.equal(value_cache, expect_v)
    assert torch.equal(key_cache[-1, -1], key[0]) and torch.equal(value_cache[-1, -1], value[0])


def test_pdl_chain_sees_each_previous_write():
    """96 pdl writes in one graph, each reading what the one before wrote (its source is a
    view of the previous cache's rows): a write that started before its predecessor had
    finished would copy stale rows. The graph is replayed with new first-step values."""
    from kdispatch.kernels._common import supports_pdl

    assert supports_pdl(torch.device("cuda")), "the GPU tests run on sm_90+"
    gen = torch.Generator(device="cuda").manual_seed(3)
    steps, tokens, heads, dim, page, blocks = 96, 8, 16, 128, 16, 4
    caches = [(_rand_(torch.empty(blocks, page, heads, dim, dtype=torch.bfloat16,
                                  device="cuda"), gen),
               _rand_(torch.empty(blocks, page, heads, dim, dtype=torch.bfloat16,
                                  device="cuda"), gen)) for _ in range(steps)]
    src_k = _rand_(torch.empty(tokens, heads, dim, dtype=torch.bfloat16, device="cuda"), gen)
    src_v = _rand_(torch.empty_like(src_k), gen)
    slots = torch.arange(tokens, device="cuda")  # rows 0..7 of block 0 in every cache
    cfg = KVWriteConfig(variant="fused", block_h=4, block_t=1, num_warps=4, pdl=True)

    def chain():
        k, v = src_k, src_v
        for kc, vc in caches:
            kdispatch.write_kv(k, v, kc, vc, slots, config=cfg)
            k, v = kc[0, :tokens], vc[0, :tokens]  # the next write reads these rows

    graph = _capture(chain)
    for step in range(3):
        _rand_(src_k, gen)
        _rand_(src_v, gen)
        graph.replay()
        torch.cuda.synchronize()
        for i in (0, steps // 2, steps - 1):
            assert torch.equal(caches[i][0][0, :tokens], src_k), (step, i)
            assert torch.equal(caches[i][1][0, :tokens], src_v), (step, i)
