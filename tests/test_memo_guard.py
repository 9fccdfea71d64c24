"""The decode memo hit's guard (one C++ tensor check before any memo key is read): it is
what serves the repeated serving call, it accepts only calls of the last entry's memo
key, it reads the tensors' metadata afresh each call, and the hit counts stay right."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import kdispatch
from kdispatch import dispatcher, tensor_guard
from kdispatch.dispatcher import Dispatcher
from kdispatch.kernels.decode_attention import OP
from kdispatch.memo import _never
from kdispatch.tensor_guard import shape_guard
from test_resolve_memo import decode_args, fresh_config

BF = torch.bfloat16


@pytest.fixture(autouse=True)
def _fresh():
    dispatcher.reset()


def _resolve(args):
    return kdispatch.resolve("decode_attention", **args)


def _last():
    return dispatcher.HOT["decode_attention"].last


def _counts():
    s = kdispatch.stats()
    return s.resolutions, s.memo_hits


def test_torch_has_the_check_and_it_passes_its_self_test():
    """The torch CI runs has the check (without it the hit keeps its memo key, slower)."""
    assert tensor_guard._TensorGuards is not None
    assert tensor_guard._works()


def test_a_check_that_raises_fails_the_self_test(monkeypatch):
    class Raising:
        def __init__(self, *tensors, **kw):
            pass

        def check(self, *tensors):
            raise TypeError("not a tensor")

    monkeypatch.setattr(tensor_guard, "_TensorGuards", Raising)
    assert tensor_guard._works() is False


def test_shape_guard_compares_type_device_dtype_and_shape(dev):
    a = torch.zeros(2, 3, device=dev, dtype=BF)
    b = torch.zeros(4, device=dev, dtype=torch.int32)
    check = shape_guard(a, b)
    assert check(torch.ones(2, 3, device=dev, dtype=BF), b.clone())
    assert check(a.t().contiguous().t(), b)  # strides are not compared (nor is the key)
    for other in [(a.half(), b), (a.view(3, 2), b), (a.view(2, 3, 1), b), (a, b[:3]),
                  (a, b.long()), (torch.zeros(2, 3, device="meta", dtype=BF), b),
                  (a, b.view(1, 4)), (a, None), (a, [0] * 4)]:
        assert not check(*other), other
    assert shape_guard(a, None) is None and shape_guard(a, a) is None


def test_shape_guard_holds_no_tensor():
    a = torch.zeros(1000)
    ref = weakref.ref(a)
    check = shape_guard(a)
    del a
    gc.collect()
    assert ref() is None and check(torch.ones(1000)) and not check(torch.ones(999))


def test_the_serving_call_is_served_by_the_guard(dev, monkeypatch):
    """After two calls (the second makes the entry the last), a repeat never reads the
    memo key, and each is counted as a memo hit."""
    args = decode_args(dev)
    cfg = _resolve(args)
    _resolve(decode_args(dev))  # other tensors, one signature
    assert _last().guard is not _never

    def no_key(args):
        raise AssertionError("the memo key was read")

    monkeypatch.setattr(dispatcher.HOT["decode_attention"], "memo_key", no_key)
    for _ in range(3):
        assert _resolve(decode_args(dev)) is cfg
    assert _counts() == (5, 4)


def test_distinct_caches_and_one_cache_for_both(dev):
    """One signature with separate k and v caches, then with one cache given as both: the
    guard of either form refuses the other (torch's check takes a tensor once), the memo
    key matches, so it is renewed; every call is counted as a hit of one entry."""
    one = decode_args(dev)
    two = {**one, "v_cache": one["k_cache"].clone()}
    cfg = _resolve(one)
    for args in (one, one, two, two, one, two):
        assert _resolve(args) is cfg
    assert _counts() == (7, 6)
    assert len(dispatcher.HOT["decode_attention"].entries) == 1


@pytest.mark.parametrize("names", [
    dict(drop="seq_lens", add="scale"),          # five names, but not the five
    dict(drop="seq_lens", add="sliding_window"),
    dict(drop=None, add="sliding_window"),       # six names
    dict(drop=None, add="batch_invariant"),
])
def test_the_guard_never_serves_other_argument_names(dev, names):
    base = decode_args(dev)
    _resolve(base)
    _resolve(base)  # the guarded last entry
    other = {k: v for k, v in base.items() if k != names["drop"]}
    other[names["add"]] = {"scale": 0.1, "sliding_window": 16,
                           "batch_invariant": True}[names["add"]]
    if names["drop"] == "seq_lens":
        with pytest.raises(ValueError):  # the slow path refuses a call without seq_lens
            _resolve(other)
    else:
        assert _resolve(other) == fresh_config("decode_attention", other)
    assert _counts()[1] == 1


@pytest.mark.parametrize("change", ["resize_", "as_strided_", "set_", ".data"])
def test_the_same_tensor_objects_changed_in_place_miss(dev, change):
    """The guard reads the tensors each call (it keeps no identity): the same Python
    objects changed in place (a block table's shape, q's dtype) are a miss, served the
    config of what they are now."""
    args = decode_args(dev, batch=2, pages=4)
    _resolve(args)
    _resolve(args)
    bt, q = args["block_table"], args["q"]
    if change == "resize_":
        bt.resize_(2, 64)
    elif change == "as_strided_":
        bt.as_strided_((2, 2), (4, 1))
    elif change == "set_":
        bt.set_(torch.zeros(2, 64, device=dev, dtype=torch.int32))
    else:  # q and the cache (one tensor for k and v) made fp16 in place
        q.data = q.data.half()
        args["k_cache"].data = args["k_cache"].data.half()
    assert args["block_table"] is bt and args["q"] is q
    assert _resolve(args) == fresh_config("decode_attention", args)
    assert _counts() == (3, 1)
    assert _resolve(args) is _resolve(args)  # and now the new signature's hits
    assert _counts() == (5, 3)
    assert kdispatch.explain("decode_attention", **args).key == \
        OP.key(dispatcher.dispatcher().device(q.device), args)


def test_a_guard_that_refuses_what_the_key_accepts_is_renewed(dev):
    """requires_grad and inference mode are outside the memo key but inside torch's check:
    the memo key serves the call, the guard is rebuilt, the next repeat takes it."""
    args = decode_args(dev)
    cfg = _resolve(args)
    _resolve(args)
    first = _last().guard
    grad = {**args, "q": args["q"].clone().requires_grad_()}
    assert _resolve(grad) is cfg
    renewed = _last().guard
    assert renewed is not first and renewed(grad) and not renewed(args)
    with torch.inference_mode():
        inf = decode_args(dev)
        assert _resolve(inf) is cfg and _resolve(inf) is cfg
        assert _last().guard(inf)
    assert _counts() == (5, 4)


def test_without_torchs_check_the_memo_key_serves(dev, monkeypatch):
    monkeypatch.setattr(tensor_guard, "_TensorGuards", None)
    args = decode_args(dev)
    cfg = _resolve(args)
    for _ in range(3):
        assert _resolve(args) is cfg
    assert _last().guard is _never
    assert _counts() == (4, 3)


def test_a_private_dispatcher_builds_the_guard_too(dev):
    """Entries are guarded where they are made (the slow path), whoever resolves."""
    d = Dispatcher()
    args = decode_args(dev)
    _, entry = d.resolve_entry("decode_attention", args)
    assert entry.guard(decode_args(dev)) and not entry.guard(decode_args(dev, hq=16))


def test_config_is_still_a_keyword(dev):
    """resolve pops ``config=`` from its keyword arguments (no parameter of that name): an
    explicit config is returned (never counted), ``config=None`` is the memo's."""
    args = decode_args(dev)
    cfg = _resolve(args)
    other = cfg.model_copy(update={"num_warps": 2 if cfg.num_warps != 2 else 4})
    assert kdispatch.resolve("decode_attention", config=other, **args) == other
    assert kdispatch.resolve("decode_attention", config=None, **args) is cfg
    assert _counts() == (2, 1)


def test_a_resolve_traced_by_torch_compile_reads_the_memo_key(dev):
    """torch.compile cannot trace the C++ check: while it traces, the guards fail and none is
    made, so the memo key serves (fullgraph), and the eager guard is kept."""
    args = decode_args(dev)
    cfg = _resolve(args)
    _resolve(args)
    guard = _last().guard

    def step(q):
        return q * kdispatch.resolve("decode_attention", **{**args, "q": q}).num_warps

    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True, backend="eager")(args["q"])
    assert torch.equal(out, args["q"] * cfg.num_warps)
    assert _last().guard is guard and guard(args)
    assert _resolve(args) is cfg
