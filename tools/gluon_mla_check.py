"""Check and time the Gluon MLA stage 1 (issue 18) against the fp32 reference and the
kdispatch Triton latent tile, in one GPU command (H100/H200, sm_90)::

    OUT=$OUT PYTHONPATH=. python3 tools/gluon_mla_check.py [--pages 16,32] [--time-pages 16]
        [--phases correct,time] [--shapes all]

A program's 64 rows are (new token, head) pairs of one request (QLEN new tokens a request,
q ``[B, QLEN, H, 576]``; ``[B, H, 576]`` when QLEN is 1); a tile is 64 tokens, ``64 // P``
pages of the cache's page size P (16, 32 or 64), each page its own TMA copies.
(a) ``correct-P`` (each P of ``--pages``): (H, QLEN) in (16,2) (128,1) (16,1) (with
``--shapes all`` also (16,4) (128,2) (12,2)) at splits 1-3, through the dispatcher with the
Gluon config (and at 2 splits through the explicit-config launch path, the launches
``launch_decode_attention`` runs, recording the compiled stage 1), ragged lengths 1, 2, 15, 16,
17, 63, 64, 65, 1000 (lengths below QLEN: a token that sees no cached token gets zeros, as
the reference and the Triton path give), -1 page ids in the unused table slots, NaN in the
cache rows past each length and in unused pages; then bad page ids inside a request's
range (out of range, negative), against the reference over the remaining pages;
(b) ``time-P`` (each P of ``--time-pages``): batch 32 x 16,384, (16,1) (16,2) at splits
2, 4, 8 and (128,1) at 1, 2 (``--shapes all``: also (16,4), (128,2)), CUDA-graph replays
(medians), TFLOPS on the real rows: the Triton tile at kdispatch's heuristic config (the
Triton branch of the heuristic where it picks Gluon) against Gluon (stage 1 + reduce
through the dispatcher, and the dispatcher's stage-1 launch alone).
Each phase runs in its own process with a time limit. Writes $OUT/gluon_mla_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton

import kdispatch
from bench_decode import time_fns
from kdispatch.kernels.decode_attention.gluon_mla import _gluon_mla_stage1
from kdispatch.kernels.decode_attention.launch import checked_plan, planned_launches
from kdispatch.kernels.decode_attention.reference import reference_decode_attention
from kdispatch.kernels.decode_attention.spec import gluon_config

DK, DV = 576, 512
RESULT: dict = {"correctness": [], "timing": [], "errors": [], "compiled": {}}
#: the compiled stage 1 of the explicit-config launches, by (splits, QLEN, page size)
COMPILED: dict = {}


SAVE: list[Path] = []  # a child's part file, rewritten after every result


def log(msg: str) -> None:
    print(msg, flush=True)
    if SAVE:  # a killed child keeps what it had
        SAVE[0].write_text(json.dumps(RESULT, indent=1, default=str))


def fail(where: str, exc: BaseException) -> None:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    log(f"FAILED {where}: {text[:3000]}")
    RESULT["errors"].append({"where": where, "error": text[:20000],
                             "trace": traceback.format_exc()[-6000:]})


def gluon_launches(q, k, bt, sl, scale: float, splits: int, out):
    """The launches of the Gluon config at ``splits`` as the explicit-config launcher
    (``launch_decode_attention``) runs them: the Gluon stage 1, then the reduce, into
    ``out``. Raises where the dispatcher would run the Triton tile for this call."""
    todo = planned_launches(gluon_config(splits), q, k, k[..., :DV], bt, sl, scale=scale,
                            out=out)
    if todo[0].fn is not _gluon_mla_stage1:
        raise RuntimeError("the dispatcher plans the Triton tile for this call, not Gluon")
    return todo


def _q(b: int, qlen: int, hq: int, g, dev):
    shape = (b, hq) if qlen == 1 else (b, qlen, hq)
    return torch.randn(*shape, DK, generator=g, device=dev).to(torch.bfloat16)


def small_case(hq: int, qlen: int, lens: list[int], dev, seed: int = 0, page: int = 64):
    """A ragged batch: permuted pages, -1 in unused slots, NaN rows past each length."""
    g = torch.Generator(device=dev).manual_seed(seed)
    PAGE = page
    max_pages = max(-(-n // PAGE) for n in lens) + 1
    used = [-(-n // PAGE) for n in lens]
    nb = sum(used) + 3
    k = torch.randn(nb, PAGE, 1, DK, generator=g, device=dev).to(torch.bfloat16)
    q = _q(len(lens), qlen, hq, g, dev)
    perm = torch.randperm(nb, generator=g, device=dev).tolist()
    bt = torch.full((len(lens), max_pages), -1, dtype=torch.int32)
    pos = 0
    for i, n in enumerate(lens):
        for j in range(used[i]):
            bt[i, j] = perm[pos]
            pos += 1
        if n % PAGE:  # the rows past the length hold NaN: they must weigh nothing
            k[int(bt[i, used[i] - 1]), n % PAGE:] = float("nan")
    for p in perm[pos:]:
        k[p] = float("nan")  # pages nobody uses
    return q, k, bt.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev)


def _compare(row: dict, name: str, got, ref) -> bool:
    err = (got.float() - ref).abs()
    tol = 3e-2 * max(1.0, ref.abs().max().item())
    ok = bool(torch.isfinite(got).all().item()) and err.max().item() <= tol
    row[f"{name}_max_err"] = err.max().item()
    row[f"{name}_err_per_request"] = err.flatten(1).amax(1).tolist()
    return ok


CORRECT_SHAPES = [(16, 2), (128, 1), (16, 1)]
MORE_SHAPES = [(16, 4), (128, 2), (12, 2)]
LENS = [1, 2, 15, 16, 17, 63, 64, 65, 1000]


def check_correctness(dev, page: int, shapes) -> None:
    cases = [(hq, t, s, LENS) for hq, t in shapes for s in (1, 2, 3)]
    cases += [(16, 1, 2, [1000]), (16, 2, 3, [65])]  # one request: fewer rows than the box
    for hq, qlen, splits, lens in cases:
        q, k, bt, sl = small_case(hq, qlen, lens, dev, seed=hq + 7 * qlen + splits, page=page)
        scale = DK ** -0.5
        v = k[..., :DV]
        ref = reference_decode_attention(q, k, v, bt, sl, scale=scale)
        row = {"case": f"page{page} h{hq} qlen{qlen} lens{lens} splits{splits}"}
        ok = True
        try:
            cfg = gluon_config(splits)
            row["dispatch_gluon"] = checked_plan(cfg, q, k, v, bt, sl, None, 0.0).gluon
            got = kdispatch.decode_attention(q, k, v, bt, sl, scale=scale, config=cfg)
            torch.cuda.synchronize()
            ok &= _compare(row, "dispatch", got, ref) and row["dispatch_gluon"]
            if splits == 2:
                got = q.new_empty(*q.shape[:-1], DV)
                compiled = [launch.run() for launch in gluon_launches(q, k, bt, sl, scale,
                                                                      splits, got)]
                COMPILED[(splits, qlen, page)] = compiled[0]
                torch.cuda.synchronize()
                ok &= _compare(row, "direct", got, ref)
        except Exception as exc:  # noqa: BLE001
            fail(f"gluon correctness {row['case']}", exc)
            ok = False
        row["gluon_ok"] = bool(ok)
        RESULT["correctness"].append(row)
        log(f"correctness {'ok' if ok else 'FAILED'} {row['case']}: dispatch err "
            f"{row.get('dispatch_max_err')} direct err {row.get('direct_max_err')}")


#: bad page ids inside the ranges of requests of 1000 and 300 tokens: (request, slot, id)
#: with id None: past the cache (num_pages + 7); slots 3 and 5: the last and the second
#: page of a tile at 16-token pages, 5 the second of tile 2 at 32
BAD_SLOTS = [(0, 3, None), (0, 5, -1), (1, 0, -5)]


def check_bad_pages(dev, page: int) -> None:
    """Bad page ids inside a request's range: the reference over the other pages."""
    for hq, qlen, splits in ((64, 1, 2), (16, 2, 3), (128, 1, 1)):
        q, k, bt, sl = small_case(hq, qlen, [1000, 300], dev, seed=7, page=page)
        nb = k.shape[0]
        bad = bt.clone()
        for r, slot, pid in BAD_SLOTS:
            bad[r, slot] = nb + 7 if pid is None else pid
        ref_bt = torch.full_like(bt, -1)
        ref_sl = sl.clone()
        for r in range(bt.shape[0]):
            skip = {slot for rr, slot, _ in BAD_SLOTS if rr == r}
            keep = [int(x) for j, x in enumerate(bt[r].tolist()) if j not in skip]
            ref_bt[r, :len(keep)] = torch.tensor(keep, dtype=torch.int32)
            ref_sl[r] -= page * len(skip)
        ref = reference_decode_attention(q, k, k[..., :DV], ref_bt, ref_sl, scale=DK ** -0.5)
        row = {"case": f"page{page} h{hq} qlen{qlen} splits{splits} bad page ids inside the "
                       f"range {BAD_SLOTS}"}
        try:
            got = kdispatch.decode_attention(q, k, k[..., :DV], bad, sl, scale=DK ** -0.5,
                                             config=gluon_config(splits))
            torch.cuda.synchronize()
            row["gluon_ok"] = _compare(row, "dispatch", got, ref)
        except Exception as exc:  # noqa: BLE001
            fail(f"gluon bad-page check {row['case']}", exc)
            row["gluon_ok"] = False
        RESULT["correctness"].append(row)
        log(f"correctness {row}")


def time_fn(fn) -> float:
    """Per-call median (us) of graph replays, by the decode benchmark's protocol
    (:func:`bench_decode.time_fns`)."""
    return time_fns([fn])[0]


def big_case(b: int, ctx: int, hq: int, qlen: int, dev, page: int = 64):
    g = torch.Generator(device=dev).manual_seed(1)
    pages = ctx // page
    nb = b * pages + 3
    k = torch.randn(nb, page, 1, DK, generator=g, device=dev, dtype=torch.bfloat16)
    q = _q(b, qlen, hq, g, dev)
    bt = torch.randperm(nb, generator=g, device=dev)[:b * pages].view(b, pages).to(torch.int32)
    sl = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    return q, k, bt, sl


def triton_config(q, k, v, bt, sl):
    """(kdispatch's resolved config, the Triton config timed: the resolved one, or where
    that is Gluon the heuristic's Triton branch)."""
    from kdispatch.dispatcher import dispatcher
    from kdispatch.kernels.decode_attention import spec as S
    from kdispatch.registry import get_op
    args = {"q": q, "k_cache": k, "v_cache": v, "block_table": bt, "seq_lens": sl,
            "sliding_window": None, "batch_invariant": False}
    ex = dispatcher().explain("decode_attention", args)
    if ex.config.kernel != "gluon":
        return ex.config, ex.config
    fits = S.gluon_fits
    S.gluon_fits = lambda key: False
    try:
        return ex.config, get_op("decode_attention").heuristic(ex.key)
    finally:
        S.gluon_fits = fits


def time_shape(dev, b: int, ctx: int, hq: int, qlen: int, splits, row: dict,
               page: int = 64) -> None:
    name = row["shape"]
    q, k, bt, sl = big_case(b, ctx, hq, qlen, dev, page)
    v = k[..., :DV]
    scale = DK ** -0.5
    flops = 2.0 * b * qlen * hq * ctx * (DK + DV)  # the real rows only
    row.update(batch=b, context=ctx, heads=hq, qlen=qlen, page=page, flops=flops)
    ref = None
    try:  # the fp32 reference on the first requests only (the loop is per request)
        ref = reference_decode_attention(q[:2], k, v, bt[:2], sl[:2], scale=scale)
    except Exception as exc:  # noqa: BLE001
        fail(f"reference {name}", exc)
    out = q.new_empty(*q.shape[:-1], DV)
    try:
        resolved, cfg = triton_config(q, k, v, bt, sl)
        row["resolved_config"] = resolved.model_dump()
        row["triton_config"] = cfg.model_dump()
        fn = lambda: kdispatch.decode_attention(q, k, v, bt, sl, scale=scale, out=out,
                                                config=cfg)
        fn()
        us = time_fn(fn)
        row.update(triton_us=us, triton_tflops=flops / us * 1e-6)
        if ref is not None:
            row["triton_err"] = (out[:2].float() - ref).abs().max().item()
        log(f"{name}: triton {us:.1f} us ({flops / us * 1e-6:.0f} TFLOPS) config "
            f"{row['triton_config']}")
    except Exception as exc:  # noqa: BLE001
        fail(f"triton timing {name}", exc)
    row["gluon"] = []
    for s in splits:
        cell = {"splits": s}
        row["gluon"].append(cell)
        try:
            cfg = gluon_config(s)
            fn = lambda cfg=cfg: kdispatch.decode_attention(q, k, v, bt, sl, scale=scale,
                                                            out=out, config=cfg)
            fn()
            torch.cuda.synchronize()
            if ref is not None:
                cell["max_err"] = (out[:2].float() - ref).abs().max().item()
            cell["us"] = time_fn(fn)
            cell["tflops"] = flops / cell["us"] * 1e-6
            cell["stage1_us"] = time_fn(gluon_launches(q, k, bt, sl, scale, s, out)[0].run)
            log(f"{name}: gluon splits {s}: {cell['us']:.1f} us ({cell['tflops']:.0f} "
                f"TFLOPS), stage 1 alone {cell.get('stage1_us', float('nan')):.1f} us, "
                f"max err {cell.get('max_err')}")
        except Exception as exc:  # noqa: BLE001
            fail(f"gluon timing {name} splits {s}", exc)
            cell["failed"] = True
    ok = [c for c in row["gluon"] if "us" in c]
    if ok:
        best = min(ok, key=lambda c: c["us"])
        row["gluon_best"] = best
        row["speedup_vs_triton"] = row.get("triton_us", float("nan")) / best["us"]
        log(f"{name}: best gluon splits {best['splits']} {best['us']:.1f} us vs triton "
            f"{row.get('triton_us', float('nan')):.1f} us: {row['speedup_vs_triton']:.2f}x")


def compiled_info() -> None:
    """Registers, spills and shared memory of the compiled stage 1 (as the JIT built it)."""
    try:
        for key, k in COMPILED.items():
            RESULT["compiled"][str(key)] = {"n_regs": k.n_regs, "n_spills": k.n_spills,
                                            "shared": k.metadata.shared}
            log(f"compiled {key}: regs {k.n_regs} spills {k.n_spills} "
                f"shared {k.metadata.shared}")
    except Exception as exc:  # noqa: BLE001
        fail("compiled info", exc)


KINDS = ("correct", "time")
#: seconds each phase may run (a hung kernel is killed with its process, the rest goes on)
PHASE_LIMIT = {"correct": 45, "time": 75}
#: (heads, QLEN, split counts) timed at batch 32 x 16,384: the 16-head grids need splits
#: to fill 132 SMs (32 x 1 head block x splits)
TIMED = [(16, 1, (2, 4, 8)), (16, 2, (2, 4, 8)), (128, 1, (1, 2))]
MORE_TIMED = [(16, 4, (2, 4, 8)), (128, 2, (1, 2))]


def run_phase(phase: str, args) -> None:
    dev = torch.device("cuda")
    kind, page = phase.rsplit("-", 1)
    page = int(page)
    every = args.shapes == "all"
    if kind == "correct":
        check_correctness(dev, page, CORRECT_SHAPES + (MORE_SHAPES if every else []))
        check_bad_pages(dev, page)
    else:
        for hq, qlen, splits in TIMED + (MORE_TIMED if every else []):
            row = {"shape": f"page{page} h{hq} qlen{qlen} b{args.batch} x {args.context}"}
            RESULT["timing"].append(row)  # filled in place: a killed child keeps its part
            try:
                time_shape(dev, args.batch, args.context, hq, qlen, splits, row, page)
            except Exception as exc:  # noqa: BLE001
                fail(f"timing {row['shape']}", exc)
            torch.cuda.empty_cache()
    compiled_info()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", default=",".join(KINDS), help="kinds: correct,time")
    ap.add_argument("--pages", default="16,32", help="page sizes checked for correctness")
    ap.add_argument("--time-pages", default="16", help="page sizes timed")
    ap.add_argument("--shapes", choices=("default", "all"), default="default")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--budget", type=float, default=170.0, help="seconds for all phases")
    ap.add_argument("--phase", help=argparse.SUPPRESS)  # a child's one phase: KIND-PAGE
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.phase:  # the child: one phase, its results as JSON
        SAVE.append(out_dir / f"gluon_mla_check.{args.phase}.json")
        run_phase(args.phase, args)
        log(f"phase {args.phase} done")
        return 0
    t0 = time.time()
    RESULT["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    RESULT["versions"] = {"torch": torch.__version__, "triton": triton.__version__}
    RESULT["phases"] = {}
    log(f"{RESULT['device']} torch {torch.__version__} triton {triton.__version__}")
    path = out_dir / "gluon_mla_check.json"
    kinds = [p for p in args.phases.split(",") if p]
    corr, tim = ([f"{kind}-{pg}" for pg in (args.pages if kind == "correct" else
                                             args.time_pages).split(",") if pg and kind in kinds]
                 for kind in KINDS)
    phases = corr[:1] + tim + corr[1:]  # the timing is not starved by a slow correctness run
    for phase in phases:
        left = args.budget - (time.time() - t0)
        limit = min(PHASE_LIMIT[phase.split("-")[0]], left)
        if limit < 15:
            RESULT["phases"][phase] = "skipped: out of time"
            log(f"phase {phase}: skipped, {left:.0f}s left")
            continue
        cmd = [sys.executable, __file__, "--phase", phase, "--batch", str(args.batch),
               "--context", str(args.context), "--shapes", args.shapes]
        part = out_dir / f"gluon_mla_check.{phase}.json"
        part.unlink(missing_ok=True)
        t1 = time.time()
        try:
            res = subprocess.run(cmd, timeout=limit, check=False)
            status = f"rc {res.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f}s (killed: a hang?)"
        RESULT["phases"][phase] = f"{status}, {time.time() - t1:.0f}s"
        log(f"phase {phase}: {RESULT['phases'][phase]}")
        if part.exists():
            sub = json.loads(part.read_text())
            for key in ("correctness", "timing", "errors"):
                RESULT[key] += sub[key]
            RESULT["compiled"].update(sub["compiled"])
        elif not status.startswith("rc 0"):
            RESULT["errors"].append({"where": f"phase {phase}", "error": status})
        RESULT["wall_s"] = time.time() - t0
        path.write_text(json.dumps(RESULT, indent=1, default=str))
    log(f"wrote {path} ({RESULT.get('wall_s', 0):.0f}s, {len(RESULT['errors'])} errors)")
    for phase, status in RESULT["phases"].items():
        log(f"SUMMARY phase {phase}: {status}")
    nan = float("nan")
    for row in RESULT["timing"]:
        cells = ", ".join(f"s{c['splits']} {c.get('us', nan):.1f} us "
                          f"({c.get('tflops', nan):.0f} TF; st1 {c.get('stage1_us', nan):.1f})"
                          for c in row.get("gluon", []))
        tc = row.get("triton_config") or {}
        log(f"SUMMARY {row['shape']}: triton {row.get('triton_us', nan):.1f} us "
            f"({row.get('triton_tflops', nan):.0f} TF; bh{tc.get('block_h')} "
            f"bn{tc.get('block_n')} w{tc.get('num_warps')} st{tc.get('num_stages')} "
            f"s{tc.get('num_kv_splits')} merge {tc.get('merge')}) | gluon {cells} | best "
            f"{row.get('speedup_vs_triton', nan):.2f}x")
    bad = [r["case"] for r in RESULT["correctness"] if not r.get("gluon_ok")]
    log(f"SUMMARY correctness: {len(RESULT['correctness']) - len(bad)} ok, failed: {bad}")
    log(f"SUMMARY errors: {[e['where'] for e in RESULT['errors']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
