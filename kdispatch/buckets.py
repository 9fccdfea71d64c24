"""Pure bucketing of dynamic sizes into dispatch-key values.

Every dynamic size in a key (batch, context capacity, token count) goes through one of
these functions, so a key is stable across nearby shapes and the table stays small.
Each rule rounds *up* (the ceil rule): a bucket's value is the largest size it covers, so
a config tuned at the bucket value has seen at least the work of every member.
"""

from __future__ import annotations


def pow2_bucket(n: int, floor: int = 1, ceil: int = 1 << 30) -> int:
    """Round ``n`` up to a power of two, clamped to ``[floor, ceil]``.

    ``floor`` and ``ceil`` must be powers of two. Sizes above ``ceil`` share its bucket.

    >>> [pow2_bucket(n) for n in (1, 2, 3, 4, 5, 17)]
    [1, 2, 4, 4, 8, 32]
    >>> pow2_bucket(3, floor=16)
    16
    >>> pow2_bucket(1000, ceil=256)
    256
    >>> pow2_bucket(0)
    Traceback (most recent call last):
    ...
    ValueError: size must be >= 1, got 0
    """
    if n < 1:
        raise ValueError(f"size must be >= 1, got {n}")
    b = 1 << (int(n) - 1).bit_length()
    return min(max(b, floor), ceil)


def half_pow2_bucket(n: int, floor: int = 1, ceil: int = 1 << 30) -> int:
    """Round ``n`` up to the next value of the series 1, 2, 3, 4, 6, 8, 12, 16, 24, ...

    Powers of two and their 1.5x midpoints: at most 1.5x between a size and its bucket,
    which matters for context capacity, where a whole power of two would double the
    work the tuner times. Clamped to ``[floor, ceil]``.

    >>> [half_pow2_bucket(n) for n in (1, 2, 3, 5, 7, 9, 13)]
    [1, 2, 3, 6, 8, 12, 16]
    >>> half_pow2_bucket(327600)
    393216
    >>> half_pow2_bucket(65536)
    65536
    >>> half_pow2_bucket(10, floor=64)
    64
    """
    if n < 1:
        raise ValueError(f"size must be >= 1, got {n}")
    p = pow2_bucket(n)
    mid = (p >> 1) + (p >> 2)  # 0.75 * p, the 1.5x step above p/2
    b = mid if (p >= 4 and n <= mid) else p
    return min(max(b, floor), ceil)
