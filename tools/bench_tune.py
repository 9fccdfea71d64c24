"""Tuning throughput on a GPU host: compile ahead vs compile at launch, one GPU vs two, and
the full search spaces (issue #20's targets), each run with an empty Triton cache and a
fresh SQLite database.

    python3 tools/bench_tune.py --steps one-gpu-6,scale-12      # ~4 min; scale-12 needs 2 GPUs
    python3 tools/bench_tune.py --steps full-both               # <= 9 min (stops at 8.5)
    python3 tools/bench_tune.py --steps full-llama              # or one preset per command
    python3 tools/bench_tune.py --cpu-dry-run                   # the plumbing, on the interpreter

Steps (targets in brackets):

- ``one-gpu-6``: llama3-8b at 6 candidates per key on cuda:0, ``--compile-workers 0`` (compile
  at launch) then the default pool [compile-ahead <= 20 s, from ~60 s]; ``ahead-6``: the
  compile-ahead run alone;
- ``scale-12``: llama3-8b at 12 per key, ``--device cuda:0`` then ``--device cuda:0,cuda:1``
  (one worker per GPU, one compile pool for the host) [>= 1.7x];
- ``full-both``: the full valid space of kimi-k3-tp8 and llama3-8b in one run on cuda:0
  [<= 10 min]; ``full-llama`` / ``full-kimi``: one preset each. A full step reports, key by
  key, the full search's best against the best of the capped candidate list (the preset's
  12 per key, measured in the same run: the same timings, no run-to-run noise).

Each run is ``python3 -m kdispatch.cli tune ...`` in a child process (its wall time includes
the start-up, as a user sees it); the tuner's throughput line (compile, GPU, candidates per
second, kernels compiled at launch) is parsed from its output. Writes
``$OUT/bench_tune-<steps>.json`` and ``.md`` (``--out``; default ``$OUT`` or ./gpu-out) and
each run's output to ``<name>.log`` beside them. Run from a source checkout with
``PYTHONPATH=$PWD`` (see tools/gpu_session.sh for the wheels the GPU image lacks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: the device machine kills a command after 10 minutes: a full run stops before
FULL_BUDGET_MIN = 8.5
CAP = 12  # the model presets' cap (kdispatch.tuning.presets.MODEL_CANDIDATES)

THROUGHPUT = re.compile(
    r"compile (?P<compile_s>[\d.]+) s \((?:(?P<kernels>\d+) kernels in (?P<workers>\d+) "
    r"processes, (?P<cpu_s>[\d.]+) s of compiler time[^;]*; )?(?P<at_launch>\d+) "
    r"(?:kernels )?compiled at launch\); GPU (?P<gpu_s>[\d.]+) s; (?P<candidates>\d+) "
    r"candidates in (?P<wall_s>[\d.]+) s \((?P<per_s>[\d.]+)/s\)")


def parse_throughput(text: str) -> dict | None:
    """The numbers of the tuner's last throughput line, or None."""
    found = list(THROUGHPUT.finditer(" ".join(text.split())))  # a wrapped line too
    if not found:
        return None
    g = found[-1].groupdict()
    return {k: (float(v) if "." in v else int(v)) for k, v in g.items() if v is not None}


def tune(name: str, args: list[str], out: Path, timeout: float) -> dict:
    """One tuner run with an empty Triton cache and a fresh database."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    db = tmp / "tune.sqlite"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KDISPATCH_DB")}
    env.update(TRITON_CACHE_DIR=str(tmp / "triton-cache"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "kdispatch.cli", "tune", *args, "--db", str(db)]
    print(f"== {time.strftime('%T')} {name}: kdispatch tune {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                           timeout=timeout, check=False)
        code, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as exc:
        code = -9
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
    wall = time.monotonic() - t0
    (out / f"{name}.log").write_text(text)
    result = {"name": name, "args": args, "exit_code": code, "wall_s": round(wall, 1),
              "throughput": parse_throughput(text),
              "budget_stopped": "budget is spent" in text,
              "keys": best_per_key(db) if db.exists() else {}}
    tail = [line for line in text.splitlines() if line.strip()][-3:]
    print(f"   exit {code}, {wall:.1f} s; " + " | ".join(tail)[-400:], flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return result


def best_per_key(db: Path) -> dict:
    """Per key: every ok measurement's time by config digest, the best, and the key."""
    from kdispatch.store import Store

    store = Store(f"sqlite:///{db}")
    try:
        out: dict = {}
        for m in store.measurements():
            e = out.setdefault(f"{m.op}:{m.key_digest}", {
                "op": m.op, "key": json.loads(m.key_json), "ok": {}, "configs": {},
                "statuses": {}})
            e["statuses"][m.status] = e["statuses"].get(m.status, 0) + 1
            if m.status == "ok" and m.verified and m.median_us is not None \
                    and not m.is_baseline:
                e["ok"][m.config_digest] = m.median_us
                e["configs"][m.config_digest] = json.loads(m.config_json)
        for e in out.values():
            if e["ok"]:
                d = min(e["ok"], key=e["ok"].get)
                e["best_us"], e["best_config"] = e["ok"][d], e["configs"][d]
        return out
    finally:
        store.dispose()


def capped_comparison(run: dict, cap: int = CAP) -> list[dict]:
    """Key by key: the full search's best vs the best of the capped candidate list."""
    from kdispatch.registry import get_op
    from kdispatch.store import digest
    from kdispatch.tuning.plan import candidate_list

    rows = []
    for e in run["keys"].values():
        if "best_us" not in e:
            continue
        op = get_op(e["op"])
        key = op.parse_key(e["key"])
        capped = {digest(c.model_dump(mode="json")) for c, _ in candidate_list(op, key, cap)}
        times = {d: t for d, t in e["ok"].items() if d in capped}
        row = {"op": e["op"], "key": {k: v for k, v in e["key"].items()
                                      if k not in ("device", "vendor", "arch", "cu_count")},
               "full_us": e["best_us"], "full_config": e["best_config"],
               "full_candidates": len(candidate_list(op, key)), "capped_candidates":
               len(capped)}
        if times:
            d = min(times, key=times.get)
            row.update(capped_us=times[d], capped_config=e["configs"][d],
                       gain_pct=round(100 * (times[d] / e["best_us"] - 1), 2))
        rows.append(row)
    return rows


def steps_of(dry: bool) -> dict:
    dev, all_dev = ("cpu", "cpu,cpu") if dry else ("cuda:0", "cuda:0,cuda:1")
    llama, kimi = ("smoke", "smoke") if dry else ("llama3-8b", "kimi-k3-tp8")
    six, twelve, full = ("2", "3", "4") if dry else ("6", "12", "all")
    budget = ["--budget-minutes", str(FULL_BUDGET_MIN)]
    return {
        "one-gpu-6": [("plain-6", ["--device", dev, "--preset", llama, "--max-candidates", six,
                                   "--compile-workers", "0"]),
                      ("ahead-6", ["--device", dev, "--preset", llama, "--max-candidates",
                                   six])],
        "ahead-6": [("ahead-6", ["--device", dev, "--preset", llama, "--max-candidates",
                                 six])],  # one-gpu-6 without its compile-at-launch twin
        "scale-12": [("one-gpu-12", ["--device", dev, "--preset", llama, "--max-candidates",
                                     twelve]),
                     ("two-gpu-12", ["--device", all_dev, "--preset", llama,
                                     "--max-candidates", twelve])],
        "full-both": [("full-both", ["--device", dev, "--preset", f"{kimi},{llama}",
                                     "--max-candidates", full, *budget])],
        "full-llama": [("full-llama", ["--device", dev, "--preset", llama, "--max-candidates",
                                       full, *budget])],
        "full-kimi": [("full-kimi", ["--device", dev, "--preset", kimi, "--max-candidates",
                                     full, *budget])],
    }


def verdicts(runs: dict) -> dict:
    """Issue #20's targets, from whichever runs this call made."""
    out: dict = {}

    def wall(name: str) -> float | None:
        r = runs.get(name)
        return r["wall_s"] if r and r["exit_code"] == 0 else None

    if wall("plain-6") and wall("ahead-6"):
        out["one_gpu_6"] = {"plain_s": wall("plain-6"), "ahead_s": wall("ahead-6"),
                            "speedup": round(wall("plain-6") / wall("ahead-6"), 2),
                            "target_le_20s": wall("ahead-6") <= 20}
    elif wall("ahead-6"):
        out["one_gpu_6"] = {"ahead_s": wall("ahead-6"), "target_le_20s": wall("ahead-6") <= 20}
    if wall("one-gpu-12") and wall("two-gpu-12"):
        ratio = wall("one-gpu-12") / wall("two-gpu-12")
        out["scale_12"] = {"one_s": wall("one-gpu-12"), "two_s": wall("two-gpu-12"),
                           "speedup": round(ratio, 2), "target_ge_1_7x": ratio >= 1.7}
    for name in ("full-both", "full-llama", "full-kimi"):
        r = runs.get(name)
        if r:
            out[name] = {"wall_s": r["wall_s"], "exit_code": r["exit_code"],
                         "complete": r["exit_code"] == 0 and not r["budget_stopped"],
                         "target_le_600s": r["exit_code"] == 0 and not r["budget_stopped"]
                         and r["wall_s"] <= 600}
    return out


def markdown(result: dict) -> str:
    lines = ["| run | exit | wall s | compile s | kernels | at launch | GPU s | candidates | "
             + "per s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"].values():
        t = r["throughput"] or {}
        lines.append(f"| {r['name']} | {r['exit_code']} | {r['wall_s']} | "
                     f"{t.get('compile_s', '-')} | {t.get('kernels', '-')} | "
                     f"{t.get('at_launch', '-')} | {t.get('gpu_s', '-')} | "
                     f"{t.get('candidates', '-')} | {t.get('per_s', '-')} |")
    lines += ["", "```", json.dumps(result["verdicts"], indent=1), "```"]
    for name, rows in result.get("full_vs_capped", {}).items():
        title = f"{name}: full search vs the best of {result['cap']} per key (same run)"
        lines += ["", title, "",
                  "| op | key | full us | capped us | gain % | full / capped candidates |",
                  "|---|---|---|---|---|---|"]
        for row in rows:
            key = " ".join(f"{k}={v}" for k, v in row["key"].items()
                           if k in ("batch", "context", "tokens", "num_q_heads"))
            lines.append(f"| {row['op']} | {key} | {row['full_us']:.2f} | "
                         f"{row.get('capped_us', float('nan')):.2f} | "
                         f"{row.get('gain_pct', '-')} | {row['full_candidates']} / "
                         f"{row['capped_candidates']} |")
    return "\n".join(lines) + "\n"


def environment() -> dict:
    """GPUs (from nvidia-smi: this process never touches CUDA), cores and versions."""
    import torch
    import triton

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
        gpus = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        gpus = []
    return {"gpus": gpus, "cpus": os.cpu_count(), "torch": torch.__version__,
            "triton": triton.__version__, "python": sys.version.split()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="one-gpu-6,scale-12",
                    help="comma-separated: one-gpu-6, ahead-6, scale-12, full-both, full-llama, "
                         "full-kimi")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    ap.add_argument("--timeout", type=float, default=570.0,
                    help="seconds one run may take (the device allows 600 per command)")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="the smoke preset on the interpreter, tiny caps (tests the script)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    table = steps_of(a.cpu_dry_run)
    names = [s.strip() for s in a.steps.split(",") if s.strip()]
    unknown = [s for s in names if s not in table]
    if unknown:
        ap.error(f"unknown steps {unknown}; known: {', '.join(table)}")
    cap = 3 if a.cpu_dry_run else CAP
    result: dict = {"environment": environment(), "runs": {}, "full_vs_capped": {},
                    "cap": cap}
    two_gpus = a.cpu_dry_run or len(result["environment"]["gpus"]) >= 2
    for step in names:
        for name, args in table[step]:
            if name == "two-gpu-12" and not two_gpus:
                print(f"== {name}: skipped (this host has fewer than 2 GPUs)", flush=True)
                continue
            run = tune(name, args, out, a.timeout)
            result["runs"][name] = run
            if name.startswith("full-"):
                result["full_vs_capped"][name] = capped_comparison(run, cap)
    result["verdicts"] = verdicts(result["runs"])
    stem = f"bench_tune-{'-'.join(names)}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result), flush=True)
    return 0 if all(r["exit_code"] == 0 for r in result["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
