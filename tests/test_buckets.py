import doctest

import pytest

import kdispatch.buckets as buckets
import kdispatch.opdef as opdef
import kdispatch.settings as settings
from kdispatch.buckets import half_pow2_bucket, pow2_bucket


def test_doctests():
    assert doctest.testmod(buckets).failed == 0
    assert doctest.testmod(settings).failed == 0
    assert doctest.testmod(opdef).attempted >= 1 and doctest.testmod(opdef).failed == 0


@pytest.mark.parametrize("fn", [pow2_bucket, half_pow2_bucket])
def test_bucket_is_monotone_ceil_and_idempotent(fn):
    prev = 0
    for n in range(1, 5000):
        b = fn(n)
        assert b >= n, (n, b)           # ceil rule: the bucket covers n
        assert b >= prev                # monotone
        assert fn(b) == b               # a bucket value is its own bucket
        prev = b


def test_half_pow2_is_within_one_and_a_half():
    for n in range(2, 100000, 37):
        assert half_pow2_bucket(n) <= 1.5 * n + 1


def test_floor_and_ceil():
    assert pow2_bucket(1, floor=8) == 8
    assert pow2_bucket(10**9, ceil=65536) == 65536
    with pytest.raises(ValueError, match="size must be >= 1"):
        half_pow2_bucket(0)
