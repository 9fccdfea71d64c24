"""Same-run A/B of two kdispatch source trees on decode_attention: fixed configs, alternating.

A kernel change is judged against the kernels it replaces measured in the same device call,
never against another session's file (two H200s differed by 6% at one MLA config in
session 7). Each side runs in its own child process whose ``PYTHONPATH`` puts that tree's
``kdispatch`` first; the sides alternate for ``--rounds`` rounds (A B, B A, ...) and every
child times the same configs on the same seeded inputs (bf16 or fp8 caches, every request
at full context or ragged, a permuted page table), checks each output against the fp32 reference,
and reports per-call medians of CUDA-graph replays. The summary is the median over rounds
of each side and their ratio.

Make the reference tree from a revision before the device call (the device copy has no
history) and carry it::

    git archive <rev> kdispatch | tar -x -C .exp/ab-ref   # .exp/ is git-ignored
    python tools/ab_decode.py --ref-path .exp/ab-ref --out $OUT/ab.json \\
        --case llama-b64:64,32,8,128,128,8192 --case kimi-b8:8,12,1,576,512,327600 \\
        --config '{"num_kv_splits": 1, "block_n": 64, "block_h": 16, "num_warps": 4,
                   "num_stages": 2}'                       # or "heuristic" (each side's own)

"heuristic" is each side's heuristic config for the case's key, whatever tables or database
the side could see (a checkout's ``db/`` table is found even with ``KDISPATCH_TABLE_DIR``
set: that variable adds a directory in front, it hides none).

A case is ``name:batch,q_heads,kv_heads,head_dim,head_dim_v,context[,fp8][,q2][,rag][,p64]``; a
latent case (kv_heads 1, head_dim > head_dim_v) passes ``v_cache = k_cache[..., :head_dim_v]``;
``rag``: ragged lengths drawn from N(context / 2, context / 4) in [1, context] (the table
stays ``context`` wide, as a serving batch's does); ``p64``: 64-token pages (else 16).
``--cpu`` runs both sides in the Triton interpreter on tiny cases (checks the plumbing; its
times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FP8_SCALE = 0.01


def parse_case(text: str) -> dict:
    """``name:b,hq,hk,dk,dv,ctx[,flags]`` -> a case dict (ValueError naming the case)."""
    try:
        name, rest = text.split(":", 1)
        parts = rest.split(",")
        b, hq, hk, dk, dv, ctx = (int(x) for x in parts[:6])
        flags = set(parts[6:])
    except ValueError as exc:
        raise ValueError(f"--case {text!r}: expected name:b,hq,hk,dk,dv,ctx[,fp8][,q2][,rag][,p64]"
                         ) from exc
    unknown = flags - {"fp8", "q2", "rag", "p64"}
    if unknown:
        raise ValueError(f"--case {text!r}: unknown flags {sorted(unknown)}")
    return {"name": name, "batch": b, "hq": hq, "hk": hk, "dk": dk, "dv": dv, "context": ctx,
            "fp8": "fp8" in flags, "q_len": 2 if "q2" in flags else 1, "ragged": "rag" in flags,
            "page": 64 if "p64" in flags else 16}


def case_inputs(case: dict, dev) -> tuple:
    """``(q, k_cache, v_cache, block_table, seq_lens, scales)`` of a case on ``dev``: seeded,
    bf16 or fp8 caches (``scales`` then holds ``k_scale``/``v_scale``), every request at
    full context (or ragged: ``rag``), a permuted page table; drawn on the device (GB-sized
    caches)."""
    import torch

    from kdispatch.kernels._common import quantize_fp8

    g = torch.Generator(device=dev).manual_seed(0)
    page = case.get("page", 16)
    pages = -(-case["context"] // page)
    nb = case["batch"] * pages + 3
    latent = case["hk"] == 1 and case["dk"] > case["dv"]
    qshape = (case["batch"], case["q_len"], case["hq"], case["dk"]) if case["q_len"] > 1 \
        else (case["batch"], case["hq"], case["dk"])
    q = torch.randn(qshape, generator=g, device=dev).to(torch.bfloat16)
    k = torch.randn(nb, page, case["hk"], case["dk"], generator=g, device=dev,
                    dtype=torch.bfloat16)
    v = None if latent else torch.randn(nb, page, case["hk"], case["dv"], generator=g,
                                        device=dev, dtype=torch.bfloat16)
    scales = {}
    if case["fp8"]:
        s = torch.full((1,), FP8_SCALE, device=dev)
        k = quantize_fp8(k, s, torch.float8_e4m3fn)
        v = None if v is None else quantize_fp8(v, s, torch.float8_e4m3fn)
        scales = {"k_scale": s, "v_scale": s}
    v = k[..., :case["dv"]] if latent else v
    bt = torch.randperm(nb, generator=g, device=dev)[:case["batch"] * pages].view(
        case["batch"], pages).to(torch.int32)
    sl = torch.full((case["batch"],), case["context"], dtype=torch.int32, device=dev)
    if case.get("ragged"):  # N(context / 2, context / 4) in [1, context], seeded by the shape
        gl = torch.Generator().manual_seed(case["batch"] * 100003 + case["context"])
        x = torch.normal(case["context"] / 2, case["context"] / 4, (case["batch"],),
                         generator=gl)
        sl = x.round().clamp(1, case["context"]).to(torch.int32).to(dev)
    return q, k, v, bt, sl, scales


def _child(cases: list[dict], configs: list[str], reps: int, cpu: bool) -> list[dict]:
    """Time every (case, config) with the ``kdispatch`` found first on the path."""
    import torch

    import kdispatch
    from kdispatch.kernels.decode_attention import reference_decode_attention

    dev = torch.device("cpu" if cpu else "cuda")
    out = []
    for case in cases:
        q, k, v, bt, sl, scales = case_inputs(case, dev)
        scale = case["dk"] ** -0.5
        ref = reference_decode_attention(q, k, v, bt, sl, scale=scale, **scales)
        for text in configs:
            if text == "heuristic":
                key = kdispatch.explain("decode_attention", q=q, k_cache=k, v_cache=v,
                                        block_table=bt, seq_lens=sl).key
                cfg = kdispatch.get_op("decode_attention").heuristic(key)
            else:
                cfg = json.loads(text)
            call = lambda: kdispatch.decode_attention(  # noqa: E731
                q, k, v, bt, sl, scale=scale, config=cfg, **scales)
            err = checked_error(f"{case['name']} {text}", call(), ref)
            out.append({"case": case["name"], "config": text,
                        "resolved": cfg if isinstance(cfg, dict) else cfg.model_dump(),
                        "us": _time(call, reps, cpu), "max_err": err})
    return out


def checked_error(what: str, got, ref) -> float:
    """The max error of ``got`` against the fp32 ``ref``; SystemExit naming ``what`` past
    the bf16 tolerance (3e-2 of the reference's scale, at least 1)."""
    err = (got.float() - ref).abs().max().item()
    if not err <= 3e-2 * max(1.0, ref.abs().max().item()):
        raise SystemExit(f"{what}: max error {err:.3g} vs the fp32 reference")
    return err


def _time(call, reps: int, cpu: bool) -> float:
    """Median per-call microseconds: CUDA-graph replays of calls lasting ~1 ms (GPU), or
    wall clock (CPU)."""
    import torch

    if cpu:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            ts.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(ts)
    call()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    call()
    t1.record()
    t1.synchronize()
    n = max(1, min(64, int(1000.0 / max(t0.elapsed_time(t1) * 1e3, 1.0))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            call()
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0.record()
        graph.replay()
        t1.record()
        t1.synchronize()
        ts.append(t0.elapsed_time(t1) * 1e3 / n)
    return statistics.median(ts)


def _run_side(tree: Path, args: argparse.Namespace) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    if args.cpu:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--reps", str(args.reps)]
    cmd += [x for c in args.case for x in ("--case", c)]
    cmd += [x for c in args.config for x in ("--config", c)]
    cmd += ["--cpu"] if args.cpu else []
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if res.returncode != 0:
        raise SystemExit(f"side {tree}: exit {res.returncode}: "
                         f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-path", type=Path, help="the reference tree (holds kdispatch/)")
    ap.add_argument("--cur-path", type=Path, default=ROOT, help="the tree under test")
    ap.add_argument("--case", action="append", default=[],
                    help="name:b,hq,hk,dk,dv,ctx[,fp8][,q2][,rag]")
    ap.add_argument("--config", action="append", default=[],
                    help='a DecodeConfig as JSON, or "heuristic" (default)')
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30, help="timed samples per config")
    ap.add_argument("--cpu", action="store_true", help="both sides in the Triton interpreter")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.config = args.config or ["heuristic"]
    cases = [parse_case(c) for c in args.case]
    if args.child:
        print(json.dumps(_child(cases, args.config, args.reps, args.cpu)))
        return 0
    if args.ref_path is None or not (args.ref_path / "kdispatch").is_dir():
        ap.error("--ref-path: a directory holding a kdispatch/ package is required")
    if not cases:
        ap.error("--case: give at least one")
    sides = {"ref": args.ref_path.resolve(), "cur": args.cur_path.resolve()}
    runs: dict[str, list[list[dict]]] = {"ref": [], "cur": []}
    for r in range(args.rounds):
        for side in (("ref", "cur") if r % 2 == 0 else ("cur", "ref")):
            runs[side].append(_run_side(sides[side], args))
    rows = []
    for i, row in enumerate(runs["cur"][0]):
        ref_us = statistics.median(run[i]["us"] for run in runs["ref"])
        cur_us = statistics.median(run[i]["us"] for run in runs["cur"])
        rows.append({"case": row["case"], "config": row["config"],
                     "resolved_ref": runs["ref"][0][i]["resolved"],
                     "resolved_cur": row["resolved"], "ref_us": ref_us, "cur_us": cur_us,
                     "cur_over_ref": cur_us / ref_us,
                     "rounds_ref": [run[i]["us"] for run in runs["ref"]],
                     "rounds_cur": [run[i]["us"] for run in runs["cur"]]})
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "sides": {
            k: str(v) for k, v in sides.items()}, "rounds": args.rounds, "rows": rows}, indent=1))
    print(f"{'case':24s} {'config':10s} {'ref us':>10s} {'cur us':>10s} {'cur/ref':>8s}")
    for row in rows:
        print(f"{row['case']:24s} {row['config'][:10]:10s} {row['ref_us']:10.1f} "
              f"{row['cur_us']:10.1f} {row['cur_over_ref']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
