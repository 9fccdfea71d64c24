"""The test-only interpreter speed-up (tests/interpreter_speed.py) changes no bits: a
decode launch (multi-token, split, GQA and the latent tile, bf16 and fp8) and KV writes
give the same outputs with it and with Triton's own language patching."""

from __future__ import annotations

import os

import pytest
import torch

import interpreter_speed
import kdispatch
from kdispatch.kernels.decode_attention import DecodeConfig, launch_decode_attention
from test_decode_multitoken import make_case

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the interpreter only")


def test_the_speed_up_is_installed_with_triton_3_6():
    import triton
    from triton.runtime import interpreter as itp

    installed = getattr(itp._patch_lang, "_kdispatch_tests", False)
    plain = os.environ.get("KDISPATCH_TEST_PLAIN_INTERPRETER") == "1"
    assert installed == (triton.__version__.startswith("3.6.") and not plain)


def _both(fn):
    fast = fn()
    with interpreter_speed.plain():
        slow = fn()
    return fast, slow


@pytest.mark.parametrize("latent", [False, True])
def test_decode_bits_with_and_without_it(latent):
    shape = dict(hq=4, hk=1, dk=48, dv=32, latent=True) if latent else dict(hq=4, hk=2, dk=32)
    args = make_case("cpu", q_len=2, lens=[1, 17, 40], dtype=torch.bfloat16, **shape)
    cfg = DecodeConfig(num_kv_splits=3, block_n=16, block_h=16)
    fast, slow = _both(lambda: launch_decode_attention(cfg, *args, scale=0.2))
    assert fast.abs().sum() > 0 and torch.equal(fast, slow)


def test_fp8_write_and_decode_bits_with_and_without_it():
    g = torch.Generator().manual_seed(3)
    k = torch.randn(5, 2, 32, generator=g).to(torch.bfloat16)
    v = torch.randn(5, 2, 32, generator=g).to(torch.bfloat16)
    slots = torch.tensor([0, 15, 16, 33, 47])

    def write():
        kc = torch.zeros(4, 16, 2, 32, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        kdispatch.write_kv(k, v, kc, vc, slots, k_scale=torch.tensor([0.5]),
                           v_scale=torch.tensor([0.25]))
        return torch.cat([kc.view(torch.uint8), vc.view(torch.uint8)])

    fast, slow = _both(write)
    assert fast.any() and torch.equal(fast, slow)
