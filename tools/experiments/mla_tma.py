"""MLA stage 1 with TMA page loads: one device run against the library's own configs.

Absorbed MLA (Hk 1, Dk 576 = 512 latent + 64 rope, V = the first 512 latent columns, bf16,
16-token pages). The library's stage 1 gathers each tile's rows through pointer tensors
(cp.async of 16 bytes per thread, addresses built per element); here every page is three
TMA copies from host-built tensor descriptors over the cache viewed as
``[num_blocks, page, 576]``: two ``[page, 256]`` latent halves and the ``[page, 64]`` rope
tail. ``NP`` pages make one loop step (online softmax over the step's ``NP x page`` tokens,
one dot chain per page, no tile concatenation). Rows past the request's end are zeroed
before the PV dots (``tl.where``), so stale cache bits (even NaN) never reach the output.
Partials are merged by the library's ``_decode_reduce``; every (variant, splits) is checked
against the fp32 reference before it is timed.

    python tools/experiments/mla_tma.py --out $OUT/mla_tma.json
    TRITON_INTERPRET=1 python tools/experiments/mla_tma.py --smoke   # CPU check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "experiments"))

from kdispatch.kernels.decode_attention import _decode_reduce  # noqa: E402
from kdispatch.kernels.decode_attention_ref import reference_decode_attention  # noqa: E402
from mla_variants import L2_BYTES, LOG2E, _p2, live_bytes, make_sets, time_graph  # noqa: E402

_NOSPEC = ["GROUP", "HEAD_BLOCKS", "NUM_KV_SPLITS", "max_len", "stride_btb", "stride_plb",
           "stride_plh"]


@triton.jit
def _page_scores(D_LAT, D_PE, pg, q0, q1, q_pe, PAGE: tl.constexpr, HALF: tl.constexpr,
                 DV: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """One page's latent halves (``[PAGE, HALF]`` each) and its ``[BLOCK_H, PAGE]`` scores."""
    k0 = D_LAT.load([pg, 0, 0]).reshape(PAGE, HALF)
    k1 = D_LAT.load([pg, 0, HALF]).reshape(PAGE, HALF)
    k_pe = D_PE.load([pg, 0, DV]).reshape(PAGE, q_pe.shape[1])
    if UPCAST:
        k0 = k0.to(tl.float32)
        k1 = k1.to(tl.float32)
        k_pe = k_pe.to(tl.float32)
    s = tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
    s = tl.dot(q0, tl.trans(k0), s, input_precision=PREC)
    s = tl.dot(q1, tl.trans(k1), s, input_precision=PREC)
    return s, k0, k1


@triton.jit(do_not_specialize=_NOSPEC)
def _s1_tma(
    Q, D_LAT, D_PE, BT, SL, PO, PL, qk_scale, max_len, GROUP, HEAD_BLOCKS, NUM_KV_SPLITS,
    stride_qb, stride_qh, stride_btb, stride_btp,
    stride_pob, stride_poh, stride_pos, stride_plb, stride_plh,
    DV: tl.constexpr, DPE: tl.constexpr, PAGE: tl.constexpr, NP: tl.constexpr,
    BLOCK_H: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, GUARD: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH: tl.constexpr,
):
    HALF: tl.constexpr = DV // 2
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    BLOCK_N: tl.constexpr = NP * PAGE
    pid_h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    kvh = pid_h // HEAD_BLOCKS
    offs_g = (pid_h % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    offs_c = tl.arange(0, HALF)
    offs_pe = tl.arange(0, DPE)

    seq_len = tl.minimum(tl.maximum(tl.load(SL + b), 0), max_len)
    chunk = tl.maximum(tl.cdiv(tl.cdiv(seq_len, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    q_row = Q + b * stride_qb + heads[:, None] * stride_qh
    q0 = tl.load(q_row + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    q1 = tl.load(q_row + HALF + offs_c[None, :], mask=h_mask[:, None], other=0.0)
    q_pe = tl.load(q_row + DV + offs_pe[None, :], mask=h_mask[:, None], other=0.0)
    if UPCAST:
        q0 = q0.to(tl.float32)
        q1 = q1.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    bt_row = BT + b * stride_btb
    offs_p = tl.arange(0, PAGE)
    pg_a = tl.load(bt_row + (start // PAGE) * stride_btp, mask=start < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        p_idx = n0 // PAGE
        if not PREFETCH:
            pg_a = tl.load(bt_row + p_idx * stride_btp)
        else:
            pg_next = tl.load(bt_row + (p_idx + NP) * stride_btp, mask=n0 + BLOCK_N < end,
                              other=0)
        s_a, k0a, k1a = _page_scores(D_LAT, D_PE, pg_a, q0, q1, q_pe, PAGE, HALF, DV,
                                     UPCAST, PREC)
        mask_a = n0 + offs_p < end
        s_a = tl.where(mask_a[None, :], s_a * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_a, 1))
        if NP == 2:
            pg_b = tl.load(bt_row + (p_idx + 1) * stride_btp, mask=n0 + PAGE < end, other=0)
            s_b, k0b, k1b = _page_scores(D_LAT, D_PE, pg_b, q0, q1, q_pe, PAGE, HALF, DV,
                                         UPCAST, PREC)
            mask_b = n0 + PAGE + offs_p < end
            s_b = tl.where(mask_b[None, :], s_b * qk_scale, float("-inf"))
            m_new = tl.maximum(m_new, tl.max(s_b, 1))
        if GUARD:
            k0a = tl.where(mask_a[:, None], k0a, 0.0)
            k1a = tl.where(mask_a[:, None], k1a, 0.0)
        alpha = tl.exp2(m_i - m_new)
        p_a = tl.exp2(s_a - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p_a, 1)
        pa = p_a.to(k0a.dtype)
        acc0 = tl.dot(pa, k0a, acc0 * alpha[:, None], input_precision=PREC)
        acc1 = tl.dot(pa, k1a, acc1 * alpha[:, None], input_precision=PREC)
        if NP == 2:
            if GUARD:
                k0b = tl.where(mask_b[:, None], k0b, 0.0)
                k1b = tl.where(mask_b[:, None], k1b, 0.0)
            p_b = tl.exp2(s_b - m_new[:, None])
            l_i += tl.sum(p_b, 1)
            pb = p_b.to(k0b.dtype)
            acc0 = tl.dot(pb, k0b, acc0, input_precision=PREC)
            acc1 = tl.dot(pb, k1b, acc1, input_precision=PREC)
        m_i = m_new
        if PREFETCH:
            pg_a = pg_next

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    has_work = start < end
    po = (PO + b * stride_pob + heads[:, None] * stride_poh + split * stride_pos
          + offs_c[None, :])
    tl.store(po, acc0 / l_safe[:, None], mask=(h_mask & has_work)[:, None])
    tl.store(po + HALF, acc1 / l_safe[:, None], mask=(h_mask & has_work)[:, None])
    tl.store(PL + b * stride_plb + heads * stride_plh + split, m_i + tl.log2(l_safe),
             mask=h_mask & has_work)


def launch(tile: tuple, splits: int, inp: dict, ws: dict) -> torch.Tensor:
    """tile = (pages per step, warps, stages, guard, pdl, prefetch): split + the reduce."""
    np_, warps, stages, guard, pdl, prefetch = tile
    q, k = inp["q"], inp["k_cache"]
    b, hq, dk = q.shape
    nb, page, hk, _ = k.shape
    dv = inp["v_cache"].shape[3]
    assert hk == 1 and inp["v_cache"].data_ptr() == k.data_ptr()
    bh = 16 if hq <= 16 else 64
    head_blocks = triton.cdiv(hq, bh)
    key = (b, hq, splits)
    if key not in ws:
        ws[key] = (torch.empty((b, hq, splits, dv), dtype=torch.float32, device=q.device),
                   torch.empty((b, hq, splits), dtype=torch.float32, device=q.device),
                   torch.empty((b, hq, dv), dtype=q.dtype, device=q.device))
    po, pl, out = ws[key]
    k3 = k[:, :, 0, :]
    shape, strides = list(k3.shape), list(k3.stride())
    d_lat = TensorDescriptor(k3, shape, strides, [1, page, dv // 2])
    d_pe = TensorDescriptor(k3, shape, strides, [1, page, dk - dv])
    interp = os.environ.get("TRITON_INTERPRET", "") == "1"
    bt, sl = inp["block_table"], inp["seq_lens"]
    max_len = bt.shape[1] * page
    _s1_tma[(head_blocks, splits, b)](
        q, d_lat, d_pe, bt, sl, po, pl, float(inp["scale"]) * LOG2E, max_len, hq, head_blocks,
        splits, q.stride(0), q.stride(1), bt.stride(0), bt.stride(1),
        po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
        DV=dv, DPE=dk - dv, PAGE=page, NP=np_, BLOCK_H=bh,
        UPCAST=interp and q.dtype != torch.float32,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", GUARD=guard,
        USE_PDL=pdl, PREFETCH=prefetch, num_warps=warps, num_stages=stages,
    )
    block_dv = min(_p2(dv), 128)
    _decode_reduce[(hq, triton.cdiv(dv, block_dv), b)](
        sl, po, pl, out, 0, max_len, sl.stride(0), po.stride(0), po.stride(1), po.stride(2),
        pl.stride(0), pl.stride(1), out.stride(0), out.stride(1),
        DV=dv, BLOCK_DV=block_dv, BLOCK_N=np_ * page, NUM_KV_SPLITS=splits,
        SPLITS_P2=max(16, _p2(splits)), SPLIT_CHUNK=16, SLIDING=False,
        USE_PDL=pdl, num_warps=4, num_stages=2, **({"launch_pdl": True} if pdl else {}),
    )
    return out


# (pages per step, warps, stages, guard, pdl, prefetch)
TILES = [(1, 4, 4, True, False, True), (1, 4, 5, True, False, True),
         (1, 4, 6, True, False, True), (1, 8, 5, True, False, True),
         (2, 4, 3, True, False, True), (2, 4, 4, True, False, True),
         (2, 8, 4, True, False, True), (1, 4, 5, False, False, True),
         (1, 4, 5, True, True, True), (1, 4, 6, True, False, False)]
PLAN = [  # (name, batch, q heads, context, split counts)
    ("deepseek-v3-tp8-mla-b32-c16384", 32, 16, 16384, [8, 16, 12]),
    ("kimi-k3-mla-b8-c327600", 8, 12, 327600, [33, 66]),
    ("deepseek-v3-tp8-mla-b8-c16384", 8, 16, 16384, [32, 64]),
]
SMOKE_PLAN = [("smoke-12h", 2, 12, 150, [1, 3]), ("smoke-16h", 3, 16, 65, [2, 5])]


def lib_rows(name, sets, ref, nbytes, ceiling) -> list[dict]:
    """The library's heuristic and its pdl twin on the same inputs (the bar to beat)."""
    from kdispatch.device import Device
    from kdispatch.kernels.decode_attention import SPEC, launch_decode_attention
    key = SPEC.key(Device.from_torch(sets[0]["q"].device), sets[0])
    h = SPEC.heuristic(key)
    rows = []
    for label, cfg in (("lib-heuristic", h),
                       ("lib-pdl", h.model_copy(update={"pdl": True, "merge": False}))):
        o = launch_decode_attention(cfg, **sets[0])
        err = (o.float() - ref).abs().max().item()
        us = time_graph(lambda i, c=cfg: launch_decode_attention(c, **i), sets)[0]
        rows.append({"shape": name, "variant": label, "config": cfg.model_dump(),
                     "max_err": err, "us": us,
                     "pct": 100 * nbytes / us / 1e3 / ceiling["gbs"]})
        print(f"{name} {label} {cfg.model_dump()} {us:.1f} us {rows[-1]['pct']:.1f}%",
              flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, no timing (CPU ok)")
    ap.add_argument("--out", default="")
    ap.add_argument("--time-limit", type=float, default=240.0)
    args = ap.parse_args()
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "command": " ".join(sys.argv), "rows": []}
    ceiling = None
    if not args.smoke:
        from bench_decode import read_ceiling
        props = torch.cuda.get_device_properties(0)
        result["device"] = {"name": props.name, "sms": props.multi_processor_count}
        ceiling = read_ceiling(props.multi_processor_count)
        result["read_ceiling"] = ceiling
        print(f"read ceiling {ceiling['gbs']:.0f} GB/s", flush=True)
    tiles = [TILES[0], TILES[4], TILES[-1]] if args.smoke else TILES
    for name, batch, hq, context, split_list in (SMOKE_PLAN if args.smoke else PLAN):
        ws_bytes = batch * context * 576 * 2
        nsets = 1 if args.smoke else max(1, min(8, math.ceil(4 * L2_BYTES / ws_bytes)))
        sets = make_sets(batch, hq, context, nsets, seed=len(name) * 7 + batch, dev=dev)
        if args.smoke:  # stale NaN bits past every request's end must not reach the output
            for inp in sets:
                live = torch.zeros(inp["k_cache"].shape[:2], dtype=torch.bool)
                for r, n in enumerate(inp["seq_lens"].tolist()):
                    for t in range(n):
                        live[inp["block_table"][r, t // 16].item(), t % 16] = True
                inp["k_cache"][~live] = float("nan")
        ref = reference_decode_attention(**sets[0])
        nbytes = live_bytes(sets[0])
        ws: dict = {}
        if not args.smoke:
            result["rows"] += lib_rows(name, sets, ref, nbytes, ceiling)
        for tile in tiles:
            for splits in split_list:
                if time.time() - t0 > args.time_limit:
                    break
                row = {"shape": name, "variant": "tma", "tile": tile, "splits": splits}
                try:
                    out = launch(tile, splits, sets[0], ws)
                except Exception as exc:  # noqa: BLE001 - infeasible configs are data
                    row["status"] = "error: " + repr(exc).splitlines()[0][:200]
                    result["rows"].append(row)
                    print(f"{name} tma {tile} s{splits}: {row['status']}", flush=True)
                    break
                err = (out.float() - ref).abs().max().item()
                row["max_err"] = err
                ok = bool(torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2))
                row["status"] = "ok" if ok else "wrong"
                if ok and not args.smoke:
                    us = time_graph(lambda i, t=tile, s=splits: launch(t, s, i, ws), sets)[0]
                    row.update(us=us, pct=100 * nbytes / us / 1e3 / ceiling["gbs"])
                    print(f"{name} tma {tile} s{splits}: {us:8.1f} us {row['pct']:5.1f}%",
                          flush=True)
                else:
                    print(f"{name} tma {tile} s{splits}: {row['status']} err {err:.2e}",
                          flush=True)
                result["rows"].append(row)
        del sets, ws
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    result["elapsed_s"] = time.time() - t0
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    timed = [r for r in result["rows"] if "us" in r]
    for name in dict.fromkeys(r["shape"] for r in timed):
        rs = sorted((r for r in timed if r["shape"] == name), key=lambda r: r["us"])
        for r in rs[:4]:
            print(f"{name:32s} {r['variant']:13s} {str(r.get('tile', '')):18s} "
                  f"s{r.get('splits', '-')!s:3s} {r['us']:8.1f} us {r['pct']:5.1f}%")
    bad = [r for r in result["rows"] if r.get("status") not in (None, "ok")]
    print(f"not ok: {len(bad)}", *(f"\n  {r}" for r in bad))


if __name__ == "__main__":
    main()
