"""Session 29, call 1: where the Gluon MLA stage 1 spends its time, program by program.

Run on the experiment tree ``.exp/diag`` (this tree with the seesaw instrumented: warpgroup
0 writes %globaltimer (and %clock64 around each segment's tiles) at the program's start, before and after each segment's q wait and
after each segment's partials store, with its SM id and tile counts, 128 int64 a program
into ``gluon_mla._dbg``)::

    PYTHONPATH=/tmp/site:.exp/diag python3 bench/results/nvidia-h200/session29/diag_timeline.py \
        --out $OUT/call1-timeline.json

Each case/config: the whole call's time (graph replays, bench_decode.time_fns), then one
graph of 8 calls replayed and the last call's timeline read back. ``plN``: the work plan
at N programs a row block's SM share (N = the config's split count); ``pNN``: the plan
forced to NN parts; ``qNN``: that in the split grid's program order (parts
2 (i % NN/2) + i // NN/2: the experiment tree's ``KD_PERM``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "tools"))
from bench_decode import _graph_of, make_sets, time_fns  # noqa: E402
from plan_launches import case_shape  # noqa: E402

import kdispatch.kernels.decode_attention.launch as L  # noqa: E402
from kdispatch.kernels.decode_attention import gluon_mla as G  # noqa: E402
from kdispatch.kernels.decode_attention.spec import gluon_config  # noqa: E402

_parts0 = L.plan_parts


def run_cfg(name, inp):
    forced = int(name[1:]) if name[0] in "pq" and not name.startswith("pl") else 0
    L.plan_parts = (lambda s, cu, rows: forced) if forced else _parts0
    if name.startswith("q"):  # the forced plan's parts in the split grid's program order
        os.environ["KD_PERM"] = str(forced // 2)
    if name.startswith("s"):
        cfg = gluon_config(int(name[1:]), False)
    elif name.startswith("pl"):
        cfg = gluon_config(int(name[2:]), True)
    else:
        cfg = gluon_config(1, True)
    fn = lambda: L.launch_decode_attention(cfg, **inp)  # noqa: E731
    us = time_fns([fn])[0]
    g = _graph_of([fn], 8)
    dbg = G._dbg(inp["q"].device)
    dbg.zero_()
    g.replay()
    torch.cuda.synchronize()
    d = dbg.view(-1, 128).cpu()
    L.plan_parts = _parts0
    os.environ.pop("KD_PERM", None)
    return us, d


def summarize(d):
    progs = [r for r in d.tolist() if r[0] != 0]
    t0 = min(r[0] for r in progs)
    segs, ends, starts, qwaits, gaps, busy, tiles = [], [], [], [], [], [], []
    cyc, ns = 0, 0
    for r in progs:
        n = max(1, r[2])
        starts.append((r[0] - t0) / 1e3)
        prev_end = r[0]
        b = 0
        for k in range(min(n, 19)):
            tq0, tq1, te, nt, c1, c2 = r[3 + 6 * k: 9 + 6 * k]
            if te == 0:
                continue
            if nt >= 32:  # the SM clock over long segments
                cyc += c2 - c1
                ns += te - tq1
            segs.append((nt, (te - tq0) / 1e3, (tq1 - tq0) / 1e3))
            gaps.append((tq0 - prev_end) / 1e3)
            qwaits.append((tq1 - tq0) / 1e3)
            b += (te - tq0) / 1e3
            prev_end = te
        ends.append((prev_end - t0) / 1e3)
        tiles.append(sum(r[6 + 6 * k] for k in range(min(n, 19))))
        busy.append(b / max(1e-9, (prev_end - r[0]) / 1e3))
    ends.sort()
    n = len(segs)
    sx = sum(s[0] for s in segs); sy = sum(s[1] for s in segs)
    sxx = sum(s[0] ** 2 for s in segs); sxy = sum(s[0] * s[1] for s in segs)
    den = n * sxx - sx * sx
    slope = (n * sxy - sx * sy) / den if den else (sy / sx if sx else 0)
    icpt = (sy - slope * sx) / n if n else 0
    q = lambda v, f: sorted(v)[min(len(v) - 1, int(f * len(v)))] if v else 0  # noqa: E731
    return {"sm_mhz": round(cyc / ns * 1e3, 1) if ns else 0,
            "programs": len(progs), "segments": n, "sms": len({r[1] for r in progs}),
            "start_spread_us": round(max(starts), 2),
            "end_us": {"min": round(ends[0], 1), "p10": round(q(ends, .1), 1),
                       "median": round(q(ends, .5), 1), "max": round(ends[-1], 1)},
            "us_per_tile_fit": round(slope, 4), "us_per_segment_fit": round(icpt, 2),
            "us_per_tile_mean": round(sy / sx, 4) if sx else 0,
            "tiles_per_program": {"min": min(tiles), "max": max(tiles)},
            "qwait_us": {"mean": round(sum(qwaits) / max(1, len(qwaits)), 2),
                         "max": round(max(qwaits), 2) if qwaits else 0},
            "gap_us_mean": round(sum(gaps) / max(1, len(gaps)), 2),
            "busy_min": round(min(busy), 3), "busy_mean": round(sum(busy) / len(busy), 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", action="append", default=[])
    args = ap.parse_args()
    cases = args.case or ["full-b32:32,16384=s2,p64,q64,pl1,s2,p64,q64,pl1",
                          "rag-b128:128,16384,rag=s1,pl1,s1,pl1"]
    rows = []
    for c in cases:
        case, cfgs = c.split("=")
        shape = case_shape(case)
        inp = make_sets(shape, 1, 0)[0]
        for name in cfgs.split(","):
            us, d = run_cfg(name, inp)
            summ = summarize(d)
            row = {"case": shape.name, "config": name, "call_us": round(us, 1), **summ}
            per_prog = [[r[0], r[1], r[2]] + r[3:3 + 6 * min(19, max(1, r[2]))]
                        for r in d.tolist() if r[0] != 0]
            rows.append({**row, "raw": per_prog})
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
