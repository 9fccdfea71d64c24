"""MLA stage 1 in transposed form (tokens and latent columns as the MMA's M): an experiment.

The library's MLA stage 1 computes ``S = Q K^T`` ([heads, tokens]) and ``O = P V``
([heads, 512]) with the 12-16 heads as the MMA's M dimension: 16 rows, so Triton 3.6 emits
mma.sync tiles, and at 2 programs per SM stage 1 is latency-bound (ncu, session 5). This
kernel computes the same thing transposed, ``S^T = K Q^T`` ([tokens, heads]) and
``O^T = V^T P^T`` ([512, heads]): M is 64 tokens or 512 latent columns, N the 16 heads, so
Hopper's warpgroup MMA (M = 64 per warpgroup, N = 16) applies without padding the heads.
The softmax runs down the token axis; the 512 latent columns are two 256-row accumulators
(as in the library's ``_decode_stage1_latent``).

Absorbed MLA only (one latent cache, Dk 576 = 512 + 64, V = the first 512 columns, no
window or cap). Partials are merged by the library's ``_decode_reduce``. Every (tile,
splits) is checked against ``reference_decode_attention`` before it is timed; the library's
heuristic is timed in the same run, with the same timing (tools/bench_decode.time_config).

    python tools/experiments/mla_transposed.py --out $OUT/mla_transposed.json
    TRITON_INTERPRET=1 python tools/experiments/mla_transposed.py --smoke    # CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from kdispatch.kernels.decode_attention import (  # noqa: E402
    _decode_reduce, _split_range, reference_decode_attention,
)

LOG2E = 1.4426950408889634


@triton.jit
def _s1_transposed(
    Q, K, BT, SL, PO, PL, qk_scale, max_len,
    stride_qb, stride_qh, stride_kb, stride_kp, stride_btb, stride_btp, stride_sl,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    H: tl.constexpr, PAGE: tl.constexpr, DV: tl.constexpr, DPE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_KV_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    HALF: tl.constexpr = DV // 2
    split = tl.program_id(1)
    b = tl.program_id(2)
    live, chunk, start, end = _split_range(SL, b, stride_sl, 0, max_len, split,
                                           NUM_KV_SPLITS, BLOCK_N, False)
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_c = tl.arange(0, HALF)
    offs_pe = tl.arange(0, DPE)
    q_col = Q + b * stride_qb + offs_h[None, :] * stride_qh
    # Q^T: [columns, heads]
    q0 = tl.load(q_col + offs_c[:, None], mask=h_mask[None, :], other=0.0)
    q1 = tl.load(q_col + HALF + offs_c[:, None], mask=h_mask[None, :], other=0.0)
    qpe = tl.load(q_col + DV + offs_pe[:, None], mask=h_mask[None, :], other=0.0)
    if UPCAST:
        q0 = q0.to(tl.float32)
        q1 = q1.to(tl.float32)
        qpe = qpe.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([HALF, BLOCK_H], dtype=tl.float32)
    acc1 = tl.zeros([HALF, BLOCK_H], dtype=tl.float32)
    bt_row = BT + b * stride_btb
    offs_n = start + tl.arange(0, BLOCK_N)
    page = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=offs_n < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        offs_next = offs_n + BLOCK_N
        page_next = tl.load(bt_row + (offs_next // PAGE) * stride_btp, mask=offs_next < end,
                            other=0)
        rows = page.to(tl.int64) * stride_kb + (offs_n % PAGE) * stride_kp
        kp = K + rows[:, None]
        k0 = tl.load(kp + offs_c[None, :], mask=n_mask[:, None], other=0.0)          # [N, 256]
        k1 = tl.load(kp + HALF + offs_c[None, :], mask=n_mask[:, None], other=0.0)   # [N, 256]
        kpe = tl.load(kp + DV + offs_pe[None, :], mask=n_mask[:, None], other=0.0)   # [N, 64]
        if UPCAST:
            k0 = k0.to(tl.float32)
            k1 = k1.to(tl.float32)
            kpe = kpe.to(tl.float32)
        s = tl.dot(kpe, qpe)                  # S^T: [N, heads]
        s = tl.dot(k0, q0, s)
        s = tl.dot(k1, q1, s)
        s = tl.where(n_mask[:, None], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        pb = p.to(k0.dtype)
        acc0 = tl.dot(tl.trans(k0), pb, acc0 * alpha[None, :])   # O^T: [256, heads] x2
        acc1 = tl.dot(tl.trans(k1), pb, acc1 * alpha[None, :])
        m_i = m_new
        page = page_next
    has_work = start < end
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    po = PO + b * stride_pob + offs_h[None, :] * stride_poh + split * stride_pos + offs_c[:, None]
    mask = (h_mask & has_work)[None, :]
    tl.store(po, acc0 / l_safe[None, :], mask=mask)
    tl.store(po + HALF, acc1 / l_safe[None, :], mask=mask)
    tl.store(PL + b * stride_plb + offs_h * stride_plh + split, m_i + tl.log2(l_safe),
             mask=h_mask & has_work)


def launch(tile: tuple, inp: dict, ws: dict) -> torch.Tensor:
    """tile = (block_n, num_warps, num_stages, splits): stage 1 transposed + the reduce."""
    bn, warps, stages, splits = tile
    q, k = inp["q"], inp["k_cache"]
    b, hq, dk = q.shape
    _, page, hk, _ = k.shape
    dv = inp["v_cache"].shape[3]
    assert hk == 1 and inp["v_cache"].data_ptr() == k.data_ptr() and dv == 512
    key = (b, hq, splits)
    if key not in ws:
        ws[key] = (torch.empty((b, hq, splits, dv), dtype=torch.float32, device=q.device),
                   torch.empty((b, hq, splits), dtype=torch.float32, device=q.device),
                   torch.empty((b, hq, dv), dtype=q.dtype, device=q.device))
    po, pl, out = ws[key]
    bt, sl = inp["block_table"], inp["seq_lens"]
    max_len = bt.shape[1] * page
    interp = os.environ.get("TRITON_INTERPRET", "") == "1"
    _s1_transposed[(1, splits, b)](
        q, k, bt, sl, po, pl, float(inp["scale"]) * LOG2E, max_len,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), bt.stride(0), bt.stride(1),
        sl.stride(0), po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        H=hq, PAGE=page, DV=dv, DPE=dk - dv, BLOCK_H=max(16, triton.next_power_of_2(hq)),
        BLOCK_N=bn, NUM_KV_SPLITS=splits, UPCAST=interp and q.dtype != torch.float32,
        num_warps=warps, num_stages=stages,
    )
    _decode_reduce[(hq, dv // 128, b)](
        sl, po, pl, out, 0, max_len, sl.stride(0), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), out.stride(0), out.stride(1),
        DV=dv, BLOCK_DV=128, BLOCK_N=bn, NUM_KV_SPLITS=splits,
        SPLITS_P2=max(16, triton.next_power_of_2(splits)), SPLIT_CHUNK=16, SLIDING=False,
        USE_PDL=False, num_warps=4, num_stages=2,
    )
    return out


def smoke() -> None:
    """CPU (interpreter): ragged lengths around tile and page boundaries, fp16 and bf16."""
    g = torch.Generator().manual_seed(0)
    lens = [1, 15, 16, 17, 63, 64, 65, 200]
    b, hq, page, pages = len(lens), 12, 16, 13
    for dtype in (torch.float16, torch.bfloat16):
        nb = b * pages + 3
        k = torch.randn(nb, page, 1, 576, generator=g).to(dtype)
        inp = dict(q=torch.randn(b, hq, 576, generator=g).to(dtype), k_cache=k,
                   v_cache=k[..., :512],
                   block_table=torch.randperm(nb, generator=g)[:b * pages].view(b, pages).int(),
                   seq_lens=torch.tensor(lens, dtype=torch.int32), scale=576 ** -0.5)
        ref = reference_decode_attention(**inp)
        for tile in ((64, 4, 2, 3), (32, 4, 3, 5)):
            out = launch(tile, inp, {})
            err = (out.float() - ref).abs().max().item()
            assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2), (dtype, tile, err)
            print(f"smoke {dtype} {tile}: max err {err:.2e}")


PLAN = {  # shape name: (batch, q heads, context, [tiles (block_n, warps, stages, splits)])
    "deepseek-v3-tp8-mla-b32-c16384": (32, 16, 16384, [
        (64, 4, 2, 8), (64, 8, 2, 8), (64, 4, 2, 4), (64, 8, 2, 4), (64, 4, 3, 4),
        (32, 4, 3, 8), (32, 8, 3, 8), (32, 4, 2, 8), (64, 4, 2, 12), (64, 4, 2, 16)]),
    "kimi-k3-mla-b8-c327600": (8, 12, 327600, [
        (64, 4, 2, 33), (64, 8, 2, 33), (64, 4, 2, 16), (64, 4, 3, 16), (32, 4, 3, 33)]),
    "deepseek-v3-tp8-mla-b8-c16384": (8, 16, 16384, [
        (64, 4, 2, 33), (64, 4, 2, 16), (32, 4, 3, 32)]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="mla_transposed.json")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter correctness check")
    ap.add_argument("--time-limit", type=float, default=200.0)
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    from bench_decode import Shape, live_bytes, make_sets, read_ceiling, time_config, time_fns

    from kdispatch.device import Device
    from kdispatch.kernels.decode_attention import SPEC, launch_decode_attention

    t0 = time.time()
    dev = Device.from_torch("cuda")
    ceiling = read_ceiling(dev.cu_count)["gbs"]
    result = {"command": " ".join(sys.argv), "read_ceiling_gbs": ceiling,
              "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    for name, (batch, hq, ctx, tiles) in PLAN.items():
        s = Shape(name, batch, hq, 1, 576, 512, ctx)
        (inp,) = make_sets(s, 1, seed=5)
        ref = reference_decode_attention(**inp)
        nbytes = live_bytes(s)
        heur = SPEC.heuristic(SPEC.key(dev, inp))
        lib = [("library heuristic", heur),
               ("library heuristic, reduce kernel", heur.model_copy(update={"merge": False}))]
        for label, cfg in lib:
            out = launch_decode_attention(cfg, **inp)
            ok = torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
            us = time_config(cfg, [inp])[0]
            result["rows"].append({"shape": name, "variant": label, "config": cfg.model_dump(),
                                   "ok": ok, "us": us, "pct": 100 * nbytes / us / 1e3 / ceiling})
            print(f"{name:32s} {label:34s} {us:8.1f} us {100 * nbytes / us / 1e3 / ceiling:5.1f}%"
                  f" ok={ok} {cfg.model_dump()}", flush=True)
        ws: dict = {}
        for tile in tiles:
            if time.time() - t0 > args.time_limit:
                break
            row = {"shape": name, "variant": "transposed", "tile": tile}
            try:
                out = launch(tile, inp, ws)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - out of shared memory etc.
                row.update(ok=False, error=str(exc).splitlines()[0][:100])
                result["rows"].append(row)
                print(f"{name:32s} transposed {tile}: {row['error']}", flush=True)
                continue
            ok = torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
            us = time_fns([lambda: launch(tile, inp, ws)])[0] if ok else float("nan")
            pct = 100 * nbytes / us / 1e3 / ceiling
            row.update(ok=ok, us=us, pct=pct)
            result["rows"].append(row)
            print(f"{name:32s} transposed {str(tile):24s} {us:8.1f} us {pct:5.1f}% ok={ok}",
                  flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        del inp, ref, ws
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
