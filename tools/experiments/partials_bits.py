"""Batch invariance at many splits, down to the partials: one request alone and in a batch.

Session 6g's check beside ``tests/gpu/test_decode_attention_gpu.py::
test_batch_invariant_bits_at_many_splits``: 40 requests x 16 heads (absorbed MLA, 128
splits from a 65,536-token capacity, ``batch_invariant=True``); the reduce launch is
wrapped to keep a copy of each call's stage-1 partials, and request 0's output,
log-sum-exps and partial outputs are compared bit for bit with the same request alone.
(Run in 6g as a scratch script with this logic; printed ``out equal True pl equal True
po equal True``.)

    python tools/experiments/partials_bits.py      (GPU; prints one line)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kdispatch  # noqa: E402
import kdispatch.kernels.decode_attention as da  # noqa: E402


class _KeepPartials:
    """Stands in for ``_decode_reduce``: copies the partials, then launches the reduce."""

    def __init__(self, real) -> None:
        self.real, self.partials = real, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.partials = (args[1].clone(), args[2].clone())  # (PO, PL)
            return self.real[grid](*args, **kwargs)
        return launch


def main() -> None:
    spy = _KeepPartials(da._decode_reduce)
    da._decode_reduce = spy
    torch.manual_seed(3)
    b, hq, dk, dv, page, cap = 40, 16, 576, 512, 16, 65536
    nb = 2000  # pages may repeat across requests: reads only
    k = torch.randn(nb, page, 1, dk, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(b, hq, dk, device="cuda", dtype=torch.bfloat16)
    bt = torch.randint(0, nb, (b, cap // page), device="cuda", dtype=torch.int32)
    sl = torch.randint(3000, 6001, (b,), device="cuda", dtype=torch.int32)
    args = dict(k_cache=k, v_cache=k[..., :dv])
    kw = dict(scale=dk ** -0.5, batch_invariant=True)
    cfg = kdispatch.resolve("decode_attention", q=q, block_table=bt, seq_lens=sl,
                            batch_invariant=True, **args)
    batched = kdispatch.decode_attention(q, args["k_cache"], args["v_cache"], bt, sl, **kw)
    po_b, pl_b = spy.partials
    alone = kdispatch.decode_attention(q[:1], args["k_cache"], args["v_cache"], bt[:1],
                                       sl[:1], **kw)
    po_a, pl_a = spy.partials
    live, splits, bn = int(sl[0]), cfg.num_kv_splits, cfg.block_n
    chunk = max(math.ceil(math.ceil(live / splits) / bn) * bn, bn)
    n = math.ceil(live / chunk)  # splits holding tokens: the only partials written
    print(f"{cfg}; {n} splits with tokens; out equal {torch.equal(batched[:1], alone)} "
          f"pl equal {torch.equal(pl_b[0, :, :n], pl_a[0, :, :n])} "
          f"po equal {torch.equal(po_b[0, :, :n], po_a[0, :, :n])}")


if __name__ == "__main__":
    main()
