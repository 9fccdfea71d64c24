"""Same-run MLA decode against the hand-written kernel (FlashMLA's Hopper dense decode).

Every latent shape of ../shared/BENCHMARKING.md (bf16; one and two query tokens; the
DeepSeek-V3 DP-attention rows with ragged lengths around a mean) is timed in one process,
the two libraries alternating for ``--rounds`` rounds on the same seeded inputs:

- ``kdispatch``: the public op (``kdispatch.decode_attention``: the shipped table, else the
  heuristic) at the shape's own page size (16 tokens, or 64 for the ragged rows);
- ``kdispatch-p64``: the same requests at 64-token pages (16-token shapes only), the page
  size the peer requires;
- ``flashmla``: the peer at 64-token pages with its schedule computed once and reused (as
  its interface does across the layers of one step);
- ``flashmla-plan``: the peer with its schedule kernel run in every call;
- ``kd-NAME`` (``--config NAME=JSON``, repeatable): kdispatch with that explicit config at
  the shape's own page size.

Each output is checked against the fp32 reference before it is timed. Times are per-call
medians of CUDA-graph replays (tools/bench_decode.py's ``time_fns``: each graph holds about
1 ms of calls, rotating among input sets when the working set is under 4x L2), the median
over rounds; TFLOPS count 2 * (576 + 512) per head, query token and cached token. The HBM
read ceiling is measured in the same run.

Usage (on the device; the peer built by tools/flashmla_peer.sh, which also says how to pack
it here)::

    tools/flashmla_peer.sh build && python3 tools/bench_flashmla.py --out $OUT/flashmla.json
    python3 tools/bench_flashmla.py --shapes ragged --rounds 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import kdispatch  # noqa: E402
from ab_decode import checked_error  # noqa: E402
from bench_decode import (  # noqa: E402
    Shape, live_bytes, make_sets, read_ceiling, rotation_sets, shapes, time_fns, variants,
)
from kdispatch.kernels.decode_attention import reference_decode_attention  # noqa: E402

PEER_BUILD = ROOT / ".peers" / "flashmla" / "build"


def load_peer():
    """The built peer module (``dense_decode_fwd``), or SystemExit naming the missing build."""
    if not any(PEER_BUILD.glob("flash_mla_dense*.so")):
        raise SystemExit(f"{PEER_BUILD}: no flash_mla_dense build (tools/flashmla_peer.sh build)")
    sys.path.insert(0, str(PEER_BUILD))
    import flash_mla_dense  # noqa: PLC0415 (built on the device, not importable here)

    return flash_mla_dense


def latent_shapes(names: str) -> list[Shape]:
    """The latent rows of bench_decode's shapes (one and two query tokens, bf16), in the
    order ``names`` gives them (comma-separated; an exact name, else a name substring)."""
    rows = [s for s in variants(shapes(), ("bf16",), (1, 2)) if s.latent]
    wanted = [w for w in names.split(",") if w]
    if not wanted:
        return rows
    out: list[Shape] = []
    for w in wanted:
        exact = [s for s in rows if s.name == w]
        out += [s for s in exact or [s for s in rows if w in s.name] if s not in out]
    return out


def flops(s: Shape) -> float:
    """2 * (dk + dv) per head, query token and visible cached token (a causal token i of Q
    sees ``len - Q + 1 + i``)."""
    vis = sum(n * s.q_len - s.q_len * (s.q_len - 1) // 2 for n in s.lengths())
    return 2.0 * s.hq * vis * (s.dk + s.dv)


def peer_fns(peer, sets: list[dict], plan_each_call: bool):
    """One callable per input set: the peer's dense decode (its output, like ours,
    ``[B, Q, H, Dv]`` for two tokens and ``[B, H, Dv]`` for one)."""
    fns = []
    for inp in sets:
        q = inp["q"] if inp["q"].dim() == 4 else inp["q"].unsqueeze(1)
        causal = q.shape[1] > 1
        args = (q, inp["k_cache"], 512, inp["seq_lens"], inp["block_table"], inp["scale"],
                causal)
        _, _, meta, splits = peer.dense_decode_fwd(*args, None, None)
        torch.cuda.synchronize()

        def call(args=args, meta=meta, splits=splits, one=inp["q"].dim() == 3):
            out = (peer.dense_decode_fwd(*args, None, None) if plan_each_call
                   else peer.dense_decode_fwd(*args, meta, splits))[0]
            return out[:, 0] if one else out
        fns.append(call)
    return fns


def ours_fns(sets: list[dict], config: dict | None = None):
    return [lambda inp=inp: kdispatch.decode_attention(**inp, config=config) for inp in sets]


def bench(s: Shape, peer, rounds: int, ceiling: float, configs: dict[str, dict]) -> dict:
    p64 = replace(s, page=64)
    nsets = rotation_sets(s)
    sides = {}
    sets = make_sets(s, nsets, seed=hash(s.name) % 1000)
    sets64 = sets if s.page == 64 else make_sets(p64, nsets, seed=hash(s.name) % 1000 + 1)
    sides["kdispatch"] = ours_fns(sets)
    for name, cfg in configs.items():
        sides[f"kd-{name}"] = ours_fns(sets, cfg)
    if s.page != 64:
        sides["kdispatch-p64"] = ours_fns(sets64)
    sides["flashmla"] = peer_fns(peer, sets64, plan_each_call=False)
    sides["flashmla-plan"] = peer_fns(peer, sets64, plan_each_call=True)
    ref = reference_decode_attention(**sets[0])
    ref64 = ref if s.page == 64 else reference_decode_attention(**sets64[0])
    errs, skipped = {}, {}
    for label in list(sides):
        try:
            errs[label] = checked_error(f"{s.name} {label}", sides[label][0](),
                                        ref64 if label.endswith("p64")
                                        or label.startswith("flashmla") else ref)
        except ValueError as exc:  # an explicit config this shape's key does not take
            if not label.startswith("kd-"):
                raise
            skipped[label] = str(exc).splitlines()[0][:200]
            del sides[label]
    del ref, ref64
    times: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    for r in range(rounds):
        for label in (order if r % 2 == 0 else order[::-1]):
            times[label].append(time_fns(sides[label])[0])
    fl = flops(s)
    row = {"shape": s.name, "batch": s.batch, "heads": s.hq, "q_len": s.q_len,
           "context": s.context, "mean": s.mean, "page": s.page, "sides": {},
           "skipped": skipped}
    for label, ts in times.items():
        us = statistics.median(ts)
        gbs = live_bytes(s) / us / 1e3
        row["sides"][label] = {"us": us, "rounds": ts, "tflops": fl / us / 1e6,
                               "pct_read_ceiling": 100 * gbs / ceiling,
                               "max_err": errs[label]}
    fm = row["sides"]["flashmla"]["us"]
    row["flashmla_over_kdispatch"] = fm / row["sides"]["kdispatch"]["us"]
    if "kdispatch-p64" in row["sides"]:
        row["flashmla_over_kdispatch_p64"] = fm / row["sides"]["kdispatch-p64"]["us"]
    del sets, sets64, sides
    torch.cuda.empty_cache()
    return row


def table(rows: list[dict]) -> None:
    print(f"{'shape':40s} {'kd us':>8s} {'kd64 us':>8s} {'fm us':>8s} {'fm+plan':>8s} "
          f"{'fm/kd':>6s} {'kd TF':>5s} {'fm TF':>5s}")
    for r in rows:
        sd = r["sides"]
        kd64 = sd.get("kdispatch-p64", {}).get("us", float("nan"))
        print(f"{r['shape']:40s} {sd['kdispatch']['us']:8.1f} {kd64:8.1f} "
              f"{sd['flashmla']['us']:8.1f} {sd['flashmla-plan']['us']:8.1f} "
              f"{r['flashmla_over_kdispatch']:6.3f} {sd['kdispatch']['tflops']:5.0f} "
              f"{sd['flashmla']['tflops']:5.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="comma-separated name substrings")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("flashmla.json"))
    ap.add_argument("--time-limit", type=float, default=1e9, help="stop starting shapes after s")
    ap.add_argument("--config", action="append", default=[],
                    help="NAME=JSON: also kdispatch with this explicit config (kd-NAME)")
    args = ap.parse_args(argv)
    configs = {}
    for text in args.config:
        name, _, js = text.partition("=")
        try:
            configs[name] = json.loads(js)
        except json.JSONDecodeError as exc:
            ap.error(f"--config {text!r}: not NAME=JSON ({exc})")
    todo = latent_shapes(args.shapes)
    if not todo:
        ap.error(f"--shapes {args.shapes!r}: matches no latent shape")
    peer = load_peer()
    torch.backends.cuda.matmul.allow_tf32 = False
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ceiling = read_ceiling(sms)
    rows = []
    t0 = time.monotonic()
    for s in todo:
        if time.monotonic() - t0 > args.time_limit:
            print(f"time limit: {s.name} and later shapes not run", flush=True)
            break
        rows.append(bench(s, peer, args.rounds, ceiling["gbs"], configs))
        args.out.write_text(json.dumps({
            "command": " ".join(sys.argv), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "read_ceiling": ceiling,
            "peer": (ROOT / ".peers" / "flashmla" / "REVISION").read_text().strip(),
            "rows": rows}, indent=1))
        print(f"{s.name}: fm/kd {rows[-1]['flashmla_over_kdispatch']:.3f}", flush=True)
    table(rows)
    if configs:
        names = [f"kd-{n}" for n in configs]
        print(f"{'shape':40s} " + " ".join(f"{n[:9]:>9s}" for n in names) + "  (us)")
        for r in rows:
            print(f"{r['shape']:40s} " + " ".join(
                f"{r['sides'][n]['us']:9.1f}" if n in r["sides"] else f"{'-':>9s}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
