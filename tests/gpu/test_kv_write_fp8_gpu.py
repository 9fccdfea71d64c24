"""The fp8 writer's division on the GPU: its branch-free reciprocal equals IEEE division's
``1 / s`` for every fp32 scale it is used on, and the bytes written equal those of
``quantize_fp8`` (torch's division on the GPU) for every bf16 value at ordinary and extreme
scales (beside 2^+-64, subnormal, huge, zero, infinite, NaN, negative).

Run on the device machine: ``python -m pytest -q -m gpu tests/gpu/test_kv_write_fp8_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kdispatch
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.kv_write.kernel import _rcp
from kernel_checks import fp8_bytes
from tool_modules import tool

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
# the scales the reciprocal serves: [2^-85, 2^64] (fp32 exponent fields 42 to 191)
EXP_LO, EXP_HI = 42, 191


@triton.jit
def _rcp_mismatches(out_ptr, LO: tl.constexpr, SIGN: tl.constexpr, BLOCK: tl.constexpr):
    bits = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK) + (LO << 23)
    s = (bits.to(tl.int32) | SIGN).to(tl.float32, bitcast=True)
    got = _rcp(s, True).to(tl.int32, bitcast=True)
    want = tl.math.div_rn(1.0, s).to(tl.int32, bitcast=True)
    tl.atomic_add(out_ptr, tl.sum((got != want).to(tl.int32)))


@pytest.mark.parametrize("sign", [0, -0x80000000], ids=["positive", "negative"])
def test_the_reciprocal_equals_the_division_for_every_scale_it_serves(sign):
    block = 4096
    count = (EXP_HI - EXP_LO + 1) << 23
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    _rcp_mismatches[(count // block,)](out, LO=EXP_LO, SIGN=sign, BLOCK=block)
    assert out.item() == 0


# ordinary scales, then the extreme ones the CPU emulation checks (tools/check_fp8_division.py)
SCALES = [0.0117, 0.0231, 1 / 3, 448 / 6] + tool("check_fp8_division").EXTREME_SCALES


@pytest.mark.parametrize("scale", SCALES, ids=[f"{s:g}" for s in SCALES])
def test_every_bf16_value_is_written_as_the_division_at_extreme_scales(scale):
    x = torch.arange(1 << 16, dtype=torch.int32, device="cuda").to(torch.int16)
    x = x.view(torch.bfloat16).view(512, 1, 128)
    cache = torch.zeros(512, 1, 1, 128, dtype=FP8, device="cuda")
    vcache = torch.zeros_like(cache)
    ks = torch.full((1,), scale, device="cuda")
    vs = -ks
    kdispatch.write_kv(x, x, cache, vcache, torch.arange(512, device="cuda"), k_scale=ks,
                       v_scale=vs)
    torch.cuda.synchronize()
    for got, s in ((cache, ks), (vcache, vs)):
        assert torch.equal(fp8_bytes(got.view(512, 1, 128)), fp8_bytes(quantize_fp8(x, s, FP8)))
