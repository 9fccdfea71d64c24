"""The fp8 writer's division on a GPU (a reciprocal product with one fused correction),
checked on the CPU by exact emulation (tools/check_fp8_division.py), and when it is used."""

import numpy as np
import pytest
from tool_modules import tool

from kdispatch.kernels.kv_write import launch as write_launch
from kdispatch.kernels.kv_write.spec import KVWriteConfig

cfd = tool("check_fp8_division")


def test_the_emulated_division_gives_the_ieee_quotients_fp8_bytes():
    assert cfd.main(["--sample", "150"]) == 0


def test_the_check_catches_a_product_without_its_correction(monkeypatch):
    monkeypatch.setattr(cfd, "div_by", lambda y, s, inv: np.float32(y * inv))
    assert cfd.main(["--sets", "adversarial", "--sample", "400"]) == 1


def test_the_check_catches_extreme_scales_left_unscaled(monkeypatch):
    """Without the power-of-two prescale a subnormal scale's reciprocal overflows."""
    def unscaled(s):
        with np.errstate(divide="ignore", over="ignore"):
            return np.float32(1.0), s, np.float32(np.float32(1.0) / s)
    monkeypatch.setattr(cfd, "scale_terms", unscaled)
    monkeypatch.setattr(cfd, "scales", lambda rng: [1e-40, 2.0 ** -149, 3e38])
    assert cfd.main(["--sets", "bf16", "--sample", "2000"]) == 1


def test_exact_fma_rounds_once_and_keeps_the_sign_of_exact_zeros():
    one, tiny = np.float32(1.0), np.float32(2.0 ** -24)
    assert cfd.fma(one + np.float32(2.0 ** -23), one - np.float32(2.0 ** -23),
                   np.float32(-1.0)) == np.float32(-(2.0 ** -46))  # exact: no rounding
    assert cfd.fma(one, tiny, one) == one                # the tie goes to even (1.0)
    assert np.signbit(cfd.fma(np.float32(-0.0), one, np.float32(-0.0)))
    assert not np.signbit(cfd.fma(one, np.float32(-1.0), one))


@pytest.mark.parametrize("cache, scaled, fast", [("float8_e4m3fn", True, True),
                                                 ("float8_e4m3fn", False, False),
                                                 ("bfloat16", False, False)])
def test_the_reciprocal_division_runs_on_a_gpu_only(monkeypatch, cache, scaled, fast):
    cfg = KVWriteConfig(block_t=1, block_h=4, num_warps=4)
    quant = cache != "bfloat16"
    plan = write_launch.plan(cfg, 1, 16, 128, 16, False, False, cache, scaled)
    assert plan.constexprs["FAST_DIV"] is False  # the interpreter divides
    assert plan.constexprs["NVIDIA"] is False
    monkeypatch.setattr(write_launch, "interpreting", lambda: False)
    plan = write_launch.plan(cfg, 1, 16, 128, 16, False, False, cache, scaled)
    assert plan.constexprs["FAST_DIV"] is fast
    assert plan.constexprs["NVIDIA"] is quant  # the reciprocal instruction, the saturating cast
    monkeypatch.setattr(write_launch.torch.version, "hip", "6.2")
    plan = write_launch.plan(cfg, 1, 16, 128, 16, False, False, cache, scaled)
    assert plan.constexprs["FAST_DIV"] is fast and plan.constexprs["NVIDIA"] is False
