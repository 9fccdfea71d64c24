"""Check the fp8 writer's division (``_div_by`` in kdispatch/kernels/kv_write/kernel.py) on the CPU.

On a GPU the writer computes ``x / scale`` as ``q0 = RN(x * inv)`` with ``inv = RN(1 / scale)``
(clamped to +-512) and one fused residual correction ``RN(q0 + RN(x - q0 * scale) * inv)``
with ``q0``'s sign, after bringing a scale outside [2^-64, 2^64] into
range by a power of two applied to ``x`` and the scale alike (zero, infinite and NaN scales
by the terms ``_scale_terms`` sets). This script emulates that arithmetic exactly --
products and fused multiply-adds as rationals, rounded once to float32, ties to even -- and
compares the fp8 bytes it yields (after the writer's saturation to +-448) with those of IEEE
division, for:

- ``bf16``/``fp16``: every finite value of the format (what a bf16 or fp16 model writes),
- ``adversarial``: fp32 values whose quotient lands on, or within three fp32 ulps of, every
  rounding midpoint between two fp8 values (where one wrong fp32 bit would show),
- ``random``: normal fp32 values,

each over a set of scales (typical KV scales, 1/3, powers of two, log-uniform ones from
e^-20 to e^20, and extreme ones: beside 2^+-64, subnormal, huge, zero, infinite, NaN). It also counts fp32 mismatches where ``|x|`` and the quotient are at least
2^-100 and the quotient below 448 (none expected; with a smaller ``x`` the residual can
underflow and the last fp32 bit differ, in quotients no fp8 value can show).

    python tools/check_fp8_division.py                 # everything (a few minutes)
    python tools/check_fp8_division.py --sets adversarial --sample 2000

Exits 1 on any fp8 mismatch.
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction

import numpy as np
import torch

F32_MIN_EXP, F32_MANT = -126, 23


def rn32(x: Fraction, negative_zero: bool = False) -> np.float32:
    """``x`` rounded to the nearest float32, ties to even (exactly)."""
    if x == 0:
        return np.float32(-0.0 if negative_zero else 0.0)
    sign, a = (-1 if x < 0 else 1), abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, F32_MIN_EXP) - F32_MANT)
    m = a / quantum
    n, rest = divmod(m.numerator, m.denominator)
    half = Fraction(rest, m.denominator)
    if half > Fraction(1, 2) or (half == Fraction(1, 2) and n % 2):
        n += 1
    v = n * quantum
    if v >= Fraction(2) ** 128:
        return np.float32(sign * np.inf)
    return np.float32(sign * float(v))


def fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """``RN(a * b + c)`` with one rounding (an exact zero keeps IEEE's sign rule; an
    infinite or NaN operand as IEEE arithmetic gives it)."""
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        with np.errstate(invalid="ignore", over="ignore"):
            return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:
        prod_negative = bool(np.signbit(a) != np.signbit(b))
        both_negative_zeros = prod_negative and bool(np.signbit(c)) and float(c) == 0.0
        return rn32(exact, both_negative_zeros)
    return rn32(exact)


def div_by(y: np.float32, scale: np.float32, inv: np.float32) -> np.float32:
    """The writer's division (``_div_by``), emulated."""
    with np.errstate(over="ignore", invalid="ignore"):
        q0 = np.float32(y * inv)
    if not np.isnan(q0):
        q0 = np.float32(np.clip(q0, -512.0, 512.0))
    q = fma(fma(np.float32(-q0), scale, y), inv, q0)
    return np.copysign(q, q0)


P64, M64 = np.float32(2.0 ** 64), np.float32(2.0 ** -64)


def scale_terms(scale: np.float32) -> tuple[np.float32, np.float32, np.float32]:
    """The writer's per-program terms (``_scale_terms``), emulated: ``(pre, sc, inv)``, the
    scale brought into [2^-85, 2^64] by a power of two, ``inv = RN(1 / sc)``."""
    a = abs(scale)
    pre = P64 if a < M64 else (M64 if a > P64 else np.float32(1.0))
    sc = np.float32(scale * pre)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.float32(np.float32(1.0) / sc)  # IEEE, correctly rounded; +-inf at +-0
    if np.isinf(a):
        inv, sc = np.copysign(np.float32(0.0), sc), np.copysign(P64, sc)
    return pre, sc, inv


def fp8_bytes(v: np.ndarray) -> np.ndarray:
    """The float8_e4m3fn bytes of ``v`` saturated to +-448 (every NaN as 0x7f)."""
    t = torch.from_numpy(np.clip(v.astype(np.float32), -448.0, 448.0))
    b = t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    return np.where(b & 0x7F == 0x7F, 0x7F, b)


def check(xs: np.ndarray, scale: float) -> tuple[int, int]:
    """(fp8 mismatches, fp32 mismatches where ``|x|`` and ``|x / scale|`` are at least
    2^-100 and the quotient below 448) for ``xs / scale``."""
    s = np.float32(scale)
    pre, sc, inv = scale_terms(s)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        want = (xs / s).astype(np.float32)
        got = np.array([div_by(np.float32(y * pre), sc, inv) for y in xs], dtype=np.float32)
    bad8 = int((fp8_bytes(want) != fp8_bytes(got)).sum())
    normal = ((np.abs(xs) >= 2.0 ** -100) & (np.abs(want) >= 2.0 ** -100)
              & (np.abs(want) < 448.0))
    bad32 = int((want[normal].view(np.uint32) != got[normal].view(np.uint32)).sum())
    return bad8, bad32


#: scales at and beyond the ends of the range the reciprocal serves unscaled ([2^-64,
#: 2^64]), subnormal, zero, infinite and NaN ones, negative ones
EXTREME_SCALES = [2.0 ** -64, 2.0 ** -64 * 0.9999999, 2.0 ** 64, 2.0 ** 64 * 1.0000001,
                  1e-30, -3e-25, 2.0 ** -126, 1e-40, 2.0 ** -149, 1e25, 3e38, -7e30, 0.0,
                  -0.0, float("inf"), -float("inf"), float("nan"), -0.0123]


def scales(rng: np.random.Generator) -> list[float]:
    return ([0.01, 0.02, 0.0123, 3e-3, 1 / 3, 1.0, 2.0 ** -6, 448 / 6]
            + list(rng.uniform(0.005, 0.05, 4)) + list(np.exp(rng.uniform(-20, 20, 4)))
            + EXTREME_SCALES)


def value_set(name: str, scale: float, rng: np.random.Generator) -> np.ndarray:
    if name == "bf16":
        xs = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    elif name == "fp16":
        xs = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    elif name == "random":
        xs = (rng.standard_normal(20000) * 0.05).astype(np.float32)
    elif name == "adversarial":
        codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        vals = sorted({v for v in codes.tolist() if np.isfinite(v)})
        mids = np.array([(a + b) / 2 for a, b in zip(vals, vals[1:])], dtype=np.float32)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            centre = (mids * np.float32(scale)).astype(np.float32)
        steps = [centre]
        up = down = centre
        for _ in range(3):
            up = np.nextafter(up, np.float32(np.inf))
            down = np.nextafter(down, np.float32(-np.inf))
            steps += [up, down]
        xs = np.concatenate(steps).astype(np.float32)
    else:
        raise ValueError(f"--sets: unknown set {name!r}")
    return xs[np.isfinite(xs)] if name == "adversarial" else xs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="adversarial,bf16,fp16,random")
    ap.add_argument("--sample", type=int, default=0, help="values per set and scale (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    total8 = total32 = 0
    for name in a.sets.split(","):
        n8 = n32 = count = 0
        for s in scales(rng):
            xs = value_set(name, s, rng)
            if a.sample and len(xs) > a.sample:
                xs = rng.choice(xs, a.sample, replace=False)
            b8, b32 = check(xs, s)
            n8, n32, count = n8 + b8, n32 + b32, count + len(xs)
        print(f"{name:12s} {count:9d} quotients: {n8} fp8 mismatches, {n32} fp32 mismatches "
              "away from underflow")
        total8, total32 = total8 + n8, total32 + n32
    return 1 if total8 else 0


if __name__ == "__main__":
    sys.exit(main())
