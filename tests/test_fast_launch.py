"""The cached launch paths' fast check (one C++ check of the last signature's tensors),
on the CPU with a recording stand-in for the direct launch (the interpreter has none): which
calls it serves, and that every change a stale entry could launch wrongly with (strides,
shape, dtype, alignment, scales) goes back through the signature with the right arguments.
The GPU runs the real launches (tests/torch/test_torch_ops.py's cached-path tests)."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch.dispatcher import reset
from kdispatch.kernels.kv_write import launch as wlaunch
from kdispatch.tensor_guard import layout_guard

pytestmark = pytest.mark.skipif(layout_guard(torch.zeros(1)) is None,
                                reason="this torch has no TensorGuards check")


class Recorder:
    """Stands in for a DirectLaunch: records each launch's arguments."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.fixture
def direct(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(wlaunch, "make_direct", lambda *a: rec)
    monkeypatch.setattr(wlaunch, "raw_stream", lambda device: 7)  # no CUDA stream here
    monkeypatch.setattr(wlaunch, "_CACHE", {})
    monkeypatch.setattr(wlaunch, "_FAST", None)
    reset()
    yield rec
    reset()


class CountingDict(dict):
    gets = 0

    def get(self, *a):
        CountingDict.gets += 1
        return super().get(*a)


def write_case(t=3, h=2, d=32, page=16, blocks=4, dtype=torch.float32):
    qkv = torch.randn(t, 3 * h * d, dtype=dtype)
    key = qkv[:, h * d:2 * h * d].view(t, h, d)
    value = qkv[:, 2 * h * d:].view(t, h, d)
    kc = torch.randn(blocks, page, h, d, dtype=dtype)
    vc = torch.randn(blocks, page, h, d, dtype=dtype)
    return key, value, kc, vc, torch.tensor([5, -1, 17])


def signature_lookups(monkeypatch) -> type[CountingDict]:
    cache = CountingDict(wlaunch._CACHE)
    CountingDict.gets = 0
    monkeypatch.setattr(wlaunch, "_CACHE", cache)
    return CountingDict


def test_a_repeated_write_takes_the_fast_path(direct, monkeypatch):
    args = write_case()
    kdispatch.write_kv(*args)  # first call: the JIT launch
    kdispatch.write_kv(*args)  # the signature's entry: a direct launch, and its check
    assert len(direct.calls) == 1
    counted = signature_lookups(monkeypatch)
    before = kdispatch.stats().resolutions
    for _ in range(3):
        kdispatch.write_kv(*args)
    assert counted.gets == 0 and len(direct.calls) == 4
    assert kdispatch.stats().resolutions - before == 3
    assert direct.calls[-1] == direct.calls[1]  # the same pointers and runtime arguments
    key, value, kc, vc, slots = args
    assert direct.calls[-1][1:6] == (key.data_ptr(), value.data_ptr(), kc.data_ptr(),
                                     vc.data_ptr(), slots.data_ptr())


def _strided_cache(c):
    out = c.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    assert out.stride() != c.stride() and torch.equal(out, c)
    return out


@pytest.mark.parametrize("change", ["key strides", "cache strides", "shape", "dtype",
                                    "alignment"])
def test_a_changed_call_goes_back_through_its_signature(direct, monkeypatch, change):
    key, value, kc, vc, slots = write_case()
    for _ in range(2):
        kdispatch.write_kv(key, value, kc, vc, slots)
    served = direct.calls[-1]
    if change == "key strides":
        key = key.contiguous()
    elif change == "cache strides":
        kc = _strided_cache(kc)
    elif change == "shape":
        key, value, slots = key[:2], value[:2], slots[:2]
    elif change == "dtype":
        key, value, kc, vc = key.half(), value.half(), kc.half(), vc.half()
    else:  # a key one element into a buffer: not 16-byte aligned, same shape and strides
        buf = torch.randn(key.numel() + 1)
        key = buf[1:].view(key.shape)
        value = value.contiguous()
        assert key.data_ptr() % 16 and key.stride() == value.stride()
    counted = signature_lookups(monkeypatch)
    kdispatch.write_kv(key, value, kc, vc, slots)  # the new signature's first call (JIT)
    assert counted.gets == 1 and len(direct.calls) == 1
    kdispatch.write_kv(key, value, kc, vc, slots)  # its entry launches, with its arguments
    assert counted.gets == 2 and len(direct.calls) == 2
    got = direct.calls[-1]
    assert got[1:6] == (key.data_ptr(), value.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                        slots.data_ptr())
    assert got[10:] == wlaunch.runtime_args(key, value, kc, vc, slots, None)
    if change != "alignment":
        assert got[10:] != served[10:] or change == "dtype"


def test_scales_are_part_of_the_fast_check(direct, monkeypatch):
    key, value, _, _, slots = write_case()
    kc = torch.zeros(4, 16, 2, 32, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    ks, vs = torch.tensor([0.5]), torch.tensor([2.0])
    for _ in range(2):
        kdispatch.write_kv(key, value, kc, vc, slots, k_scale=ks, v_scale=vs)
    counted = signature_lookups(monkeypatch)
    kdispatch.write_kv(key, value, kc, vc, slots, k_scale=ks.clone(), v_scale=vs.clone())
    assert counted.gets == 0  # other scale tensors of the same layout: the same entry
    with pytest.raises(ValueError, match="k_scale"):
        kdispatch.write_kv(key, value, kc, vc, slots, v_scale=vs)
    with pytest.raises(ValueError, match="scale"):
        kdispatch.write_kv(key, value, kc, vc, slots, k_scale=ks)
    kdispatch.write_kv(key, value, kc, vc, slots)  # no scales: another signature
    assert counted.gets == 3


def test_options_and_a_reset_leave_the_fast_path(direct, monkeypatch):
    key, value, kc, vc, slots = write_case()
    for _ in range(2):
        kdispatch.write_kv(key, value, kc, vc, slots)
    counted = signature_lookups(monkeypatch)
    kdispatch.write_kv(key, value, kc, vc, slots, row_mask=torch.ones(3, dtype=torch.bool))
    assert counted.gets == 1
    reset()  # another dispatcher: entries of the old one are not served
    kdispatch.write_kv(key, value, kc, vc, slots)
    assert counted.gets == 2
    kdispatch.write_kv(key, key, kc, vc, slots)  # one tensor twice: torch's check raises
    assert counted.gets == 3                        # on it; the signature serves the call
    with pytest.raises(ValueError, match="^slot_mapping"):
        kdispatch.write_kv(key, value, kc, vc, slots[:2])
