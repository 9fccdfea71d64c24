"""Check and time the Gluon MLA stage 1 prototype (issue 18) against the fp32 reference and
the existing kdispatch MLA path, in one GPU command (H100/H200, sm_90)::

    OUT=$OUT PYTHONPATH=. python3 tools/gluon_mla_check.py [--quick]

(a) correctness on small ragged shapes (lengths 1, 63, 64, 65, 1000; -1 page ids in the
unused table slots; NaN in the cache rows past each length and in unused pages; a bad page
id inside a request's range, checked against the reference over the remaining pages);
(b) times, CUDA-graph replays (medians of do_bench'd replays of a graph of many calls):
128 heads, batch 32 x 16,384 and 32 x 4,096, 64-token pages, permuted page tables; the
kdispatch path at its heuristic config and the Gluon path at several split counts (stage
1 + the existing reduce, and stage 1 alone). A failure of the Gluon kernel (compile or
run) is reported and the rest goes on. Writes $OUT/gluon_mla_check.json.
"""

from __future__ import annotations

import argparse
import json
import math
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
from kdispatch.kernels.decode_attention.reference import reference_decode_attention

PAGE, DK, DV = 64, 576, 512
GRAPH_US, MAX_CALLS = 1000.0, 32
RESULT: dict = {"correctness": [], "timing": [], "errors": [], "compiled": {}}


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


def gluon_module():
    try:
        from kdispatch.kernels.decode_attention import gluon_mla
        return gluon_mla
    except Exception as exc:  # noqa: BLE001 - report and go on without it
        fail("import gluon_mla", exc)
        return None


def small_case(hq: int, lens: list[int], dev, seed: int = 0):
    """A ragged batch: permuted pages, -1 in unused slots, NaN rows past each length."""
    g = torch.Generator(device=dev).manual_seed(seed)
    max_pages = max(-(-n // PAGE) for n in lens) + 1
    used = [-(-n // PAGE) for n in lens]
    nb = sum(used) + 3
    k = torch.randn(nb, PAGE, 1, DK, generator=g, device=dev).to(torch.bfloat16)
    q = torch.randn(len(lens), hq, DK, generator=g, device=dev).to(torch.bfloat16)
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


def check_correctness(G, dev) -> None:
    lens = [1, 63, 64, 65, 1000]
    cases = [(64, 1, False), (64, 3, False), (128, 2, False), (128, 1, True), (64, 3, True)]
    for hq, splits, ov in cases:
        q, k, bt, sl = small_case(hq, lens, dev, seed=hq + splits)
        scale = DK ** -0.5
        v = k[..., :DV]
        ref = reference_decode_attention(q, k, v, bt, sl, scale=scale)
        row = {"case": f"h{hq} lens{lens} splits{splits} overlap_pv {ov}"}
        try:
            got = G.gluon_mla_decode(q, k, bt, sl, scale, splits, overlap_pv=ov).float()
            torch.cuda.synchronize()
            err = (got - ref).abs().max().item()
            row.update(gluon_max_err=err, gluon_ok=bool(err <= 3e-2 * max(1.0, ref.abs().max().item())),
                       gluon_finite=bool(torch.isfinite(got).all().item()))
            per = (got - ref).abs().amax(dim=(1, 2)).tolist()
            row["gluon_err_per_request"] = per
        except Exception as exc:  # noqa: BLE001
            fail(f"gluon correctness {row['case']}", exc)
            row["gluon_ok"] = False
        try:
            kd = kdispatch.decode_attention(q, k, v, bt, sl, scale=scale).float()
            row["kdispatch_max_err"] = (kd - ref).abs().max().item()
        except Exception as exc:  # noqa: BLE001
            fail(f"kdispatch correctness {row['case']}", exc)
        RESULT["correctness"].append(row)
        log(f"correctness {row}")


def check_bad_pages(G, dev) -> None:
    """A bad page id inside a request's range: the reference over the other pages."""
    q, k, bt, sl = small_case(64, [1000, 300], dev, seed=7)
    nb = k.shape[0]
    bad = bt.clone()
    bad[0, 3] = nb + 7
    bad[1, 0] = -5
    ref_bt = bt.clone()
    ref_bt[0, 3:-1] = bt[0, 4:].clone()
    ref_bt[1, 0:-1] = bt[1, 1:].clone()
    ref_sl = sl - PAGE
    ref = reference_decode_attention(q, k, k[..., :DV], ref_bt, ref_sl, scale=DK ** -0.5)
    row = {"case": "bad page ids inside the range (nb+7 at slot 3, -5 at slot 0)"}
    try:
        got = G.gluon_mla_decode(q, k, bad, sl, DK ** -0.5, 2).float()
        torch.cuda.synchronize()
        err = (got - ref).abs().max().item()
        row.update(gluon_max_err=err, gluon_ok=bool(err <= 3e-2 * max(1.0, ref.abs().max().item())))
    except Exception as exc:  # noqa: BLE001
        fail("gluon bad-page check", exc)
        row["gluon_ok"] = False
    RESULT["correctness"].append(row)
    log(f"correctness {row}")


def _graph_of(fns, calls: int):
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fns[i % len(fns)]()
    torch.cuda.synchronize()
    return graph


def time_fn(fn) -> float:
    """Per-call median (us) of do_bench'd replays of a graph of about GRAPH_US of calls."""
    fn()
    torch.cuda.synchronize()
    graph = _graph_of([fn], 2)
    med = triton.testing.do_bench(graph.replay, warmup=5, rep=20, return_mode="median")
    n = min(MAX_CALLS, max(2, math.ceil(GRAPH_US / (med * 1e3 / 2))))
    del graph
    graph = _graph_of([fn], n)
    med = triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median")
    del graph
    return med * 1e3 / n


def big_case(b: int, ctx: int, hq: int, dev):
    g = torch.Generator(device=dev).manual_seed(1)
    pages = ctx // PAGE
    nb = b * pages + 3
    k = torch.randn(nb, PAGE, 1, DK, generator=g, device=dev, dtype=torch.bfloat16)
    q = torch.randn(b, hq, DK, generator=g, device=dev).to(torch.bfloat16)
    bt = torch.randperm(nb, generator=g, device=dev)[:b * pages].view(b, pages).to(torch.int32)
    sl = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    return q, k, bt, sl


def time_shapes(G, dev, shapes, split_list) -> None:
    for b, ctx, hq in shapes:
        row = {"shape": f"h{hq} b{b} x {ctx}"}
        RESULT["timing"].append(row)  # filled in place: a killed child keeps its part
        time_shape(G, dev, b, ctx, hq, split_list, row)
        torch.cuda.empty_cache()


def time_shape(G, dev, b: int, ctx: int, hq: int, split_list, row: dict) -> None:
    name = f"h{hq} b{b} x {ctx}"
    q, k, bt, sl = big_case(b, ctx, hq, dev)
    v = k[..., :DV]
    scale = DK ** -0.5
    flops = 2.0 * b * hq * ctx * (DK + DV)
    ref = None
    try:  # the fp32 reference on the first requests only (the loop is per request)
        ref = reference_decode_attention(q[:2], k, v, bt[:2], sl[:2], scale=scale)
    except Exception as exc:  # noqa: BLE001
        fail(f"reference {name}", exc)
    row.update(batch=b, context=ctx, heads=hq, flops=flops)
    try:
        out = torch.empty(b, hq, DV, dtype=q.dtype, device=dev)
        fn = lambda: kdispatch.decode_attention(q, k, v, bt, sl, scale=scale, out=out)
        fn()
        cfg = kdispatch.resolve("decode_attention", q=q, k_cache=k, v_cache=v,
                                block_table=bt, seq_lens=sl)
        row["kdispatch_config"] = cfg if isinstance(cfg, dict) else cfg.model_dump()
        us = time_fn(fn)
        row["kdispatch_us"] = us
        row["kdispatch_tflops"] = flops / us * 1e-6
        if ref is not None:
            row["kdispatch_err"] = (out[:2].float() - ref).abs().max().item()
        log(f"{name}: kdispatch {us:.1f} us ({flops / us * 1e-6:.0f} TFLOPS) "
            f"config {row['kdispatch_config']}")
    except Exception as exc:  # noqa: BLE001
        fail(f"kdispatch timing {name}", exc)
    if G is not None:
        row["gluon"] = []
        for s, ov in split_list:
            cell = {"splits": s, "overlap_pv": ov}
            try:
                n_ws = b * hq * s * (DV + 1)
                ws = torch.empty(n_ws, dtype=torch.float32, device=dev)
                out = torch.empty(b, hq, DV, dtype=q.dtype, device=dev)
                fn = lambda s=s, ov=ov, ws=ws, out=out: G.gluon_mla_decode(
                    q, k, bt, sl, scale, s, out=out, workspace=ws, overlap_pv=ov)
                fn()
                torch.cuda.synchronize()
                if ref is not None:
                    cell["max_err"] = (out[:2].float() - ref).abs().max().item()
                cell["us"] = time_fn(fn)
                cell["tflops"] = flops / cell["us"] * 1e-6
                po = ws[:b * hq * s * DV].view(b, hq, s, DV)
                pl = ws[b * hq * s * DV:].view(b, hq, s)
                grid, args, kw = G.stage1_launch_args(q, k, bt, sl, scale, s, po, pl, ov)
                st1 = lambda grid=grid, args=args, kw=kw: G._gluon_mla_stage1[grid](
                    *args, **kw)
                cell["stage1_us"] = time_fn(st1)
                log(f"{name}: gluon splits {s} overlap_pv {ov}: {cell['us']:.1f} us "
                    f"({cell['tflops']:.0f} TFLOPS), stage 1 alone {cell['stage1_us']:.1f} us, "
                    f"max err {cell.get('max_err')}")
            except Exception as exc:  # noqa: BLE001
                fail(f"gluon timing {name} splits {s} overlap_pv {ov}", exc)
                cell["failed"] = True
            row["gluon"].append(cell)
        ok = [c for c in row["gluon"] if "us" in c]
        if ok:
            best = min(ok, key=lambda c: c["us"])
            row["gluon_best"] = best
            ref_us = row.get("kdispatch_us", float("nan"))
            row["speedup_vs_kdispatch"] = ref_us / best["us"]
            log(f"{name}: best gluon splits {best['splits']} overlap_pv {best['overlap_pv']} "
                f"{best['us']:.1f} us ({best['tflops']:.0f} TFLOPS) vs kdispatch {ref_us:.1f} "
                f"us: {row['speedup_vs_kdispatch']:.2f}x")


def compiled_info(G) -> None:
    """Registers, spills and shared memory of the compiled stage 1 (as the JIT built it)."""
    try:
        for key, k in getattr(G, "COMPILED", {}).items():
            RESULT["compiled"][str(key)] = {"n_regs": k.n_regs, "n_spills": k.n_spills,
                                            "shared": k.metadata.shared}
            log(f"compiled {key}: regs {k.n_regs} spills {k.n_spills} "
                f"shared {k.metadata.shared}")
    except Exception as exc:  # noqa: BLE001
        fail("compiled info", exc)


PHASES = ("correct", "time-16k", "time-4k", "bad-pages")
#: seconds each phase may run (a hung kernel is killed with its process, the rest goes on)
PHASE_LIMIT = {"correct": 100, "time-16k": 120, "time-4k": 90, "bad-pages": 45}


def run_phase(phase: str, args) -> None:
    dev = torch.device("cuda")
    G = gluon_module()
    variants = [(int(x), False) for x in args.splits.split(",") if x]
    variants += [(int(x), True) for x in args.overlap_splits.split(",") if x]
    if phase == "correct" and G is not None:
        check_correctness(G, dev)
    elif phase == "time-16k":
        time_shapes(G, dev, [(32, 16384, 128)], variants)
    elif phase == "time-4k":
        time_shapes(G, dev, [(32, 4096, 128)], variants)
    elif phase == "bad-pages" and G is not None:
        check_bad_pages(G, dev)
    if G is not None:
        compiled_info(G)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="no b32 x 16,384 timing")
    ap.add_argument("--splits", default="1,2,3,4", help="split counts, PV waited per page")
    ap.add_argument("--overlap-splits", default="2,4",
                    help="split counts also timed with the PV MMA left in flight")
    ap.add_argument("--budget", type=float, default=225.0, help="seconds for all phases")
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # a child's one phase
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
    for phase in PHASES:
        if args.quick and phase == "time-16k":
            continue
        left = args.budget - (time.time() - t0)
        limit = min(PHASE_LIMIT[phase], left)
        if limit < 15:
            RESULT["phases"][phase] = "skipped: out of time"
            log(f"phase {phase}: skipped, {left:.0f}s left")
            continue
        cmd = [sys.executable, __file__, "--phase", phase, "--splits", args.splits,
               "--overlap-splits", args.overlap_splits]
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
    log(f"wrote {path} ({RESULT['wall_s']:.0f}s, {len(RESULT['errors'])} errors)")
    for row in RESULT["timing"]:
        best = row.get("gluon_best") or {}
        log(f"SUMMARY {row['shape']}: kdispatch {row.get('kdispatch_us', float('nan')):.1f} us, "
            f"gluon best {best.get('us', float('nan')):.1f} us (splits {best.get('splits')}, "
            f"overlap_pv {best.get('overlap_pv')}, {best.get('tflops', float('nan')):.0f} TFLOPS)")
    bad = [r["case"] for r in RESULT["correctness"] if not r.get("gluon_ok")]
    log(f"SUMMARY correctness: {len(RESULT['correctness']) - len(bad)} ok, failed: {bad}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
