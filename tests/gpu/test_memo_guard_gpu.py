"""The decode memo hit's C++ guard on CUDA tensors: it serves the repeated serving call,
and refuses the same shapes on the CPU, another dtype and another shape; with two GPUs,
the same call on the other device."""

from __future__ import annotations

import pytest
import torch

import kdispatch
from kdispatch import dispatcher
from kdispatch.memo import _never
from test_resolve_memo import decode_args

pytestmark = pytest.mark.gpu


def test_the_guard_serves_cuda_calls_and_refuses_other_devices_dtypes_and_shapes():
    dispatcher.reset()
    args = decode_args("cuda:0")
    cfg = kdispatch.resolve("decode_attention", **args)
    assert kdispatch.resolve("decode_attention", **decode_args("cuda:0")) is cfg
    guard = dispatcher.HOT["decode_attention"].last.guard
    assert guard is not _never and guard(decode_args("cuda:0"))
    assert not guard(decode_args("cpu"))
    assert not guard(decode_args("cuda:0", dtype=torch.float16))
    assert not guard(decode_args("cuda:0", batch=3))
    s = kdispatch.stats()
    assert (s.resolutions, s.memo_hits) == (2, 1)
    if torch.cuda.device_count() > 1:  # the device index is part of the check
        assert not guard(decode_args("cuda:1"))
