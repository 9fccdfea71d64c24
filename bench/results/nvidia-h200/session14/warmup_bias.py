"""Session 14: does the tuner's 200 ms key warm-up leave a compute-bound key's first timed
candidate slow? For each key, trials as the sweep runs a key (fresh inputs and reference,
a fresh KeyBest): the heuristic timed first with KEY_WARMUP_MS = w, then the same config
twice more (its identical twins, no warm-up). Prints first / last twin per trial.

    python3 bench/results/nvidia-h200/session14/warmup_bias.py --out bias.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from kdispatch.registry import get_op  # noqa: E402
from kdispatch.tuning import measure as M  # noqa: E402
from kdispatch.tuning.inputs import KeyInputs  # noqa: E402

DB = Path(__file__).with_name("h200.sqlite")
KEYS = {  # name: predicate on a recorded key
    "dp128-b128-32k": lambda k: (k["batch"], k["context"], k["num_q_heads"], k["q_len"],
                                 k["kv_dtype"]) == (128, 32768, 128, 1, "bfloat16"),
    "dp128-b32-32k": lambda k: (k["batch"], k["context"], k["num_q_heads"], k["q_len"],
                                k["kv_dtype"]) == (32, 32768, 128, 1, "bfloat16"),
    "llama-b4-262k": lambda k: (k["batch"], k["context"], k["num_q_heads"], k["q_len"],
                                k["kv_dtype"], k["head_dim"]) == (4, 262144, 32, 1,
                                                                  "bfloat16", 128),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--warm", default="200,60,0")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    op = get_op("decode_attention")
    dev = torch.device("cuda")
    rows = sqlite3.connect(DB).execute(
        "select distinct key_json from kd_measurements where op='decode_attention'").fetchall()
    out = []
    for name, pred in KEYS.items():
        kj = next(json.loads(k) for (k,) in rows if pred(json.loads(k)))
        key = op.parse_key(kj)
        cfg = op.heuristic(key)
        for rnd in range(args.rounds):
            for w in (float(x) for x in args.warm.split(",")):
                M.KEY_WARMUP_MS = w
                inputs = KeyInputs(op, key, dev, rnd)
                best = M.KeyBest()
                times = []
                for role in ("heuristic", "candidate", "candidate"):
                    _, t = M.measure(op, key, cfg, role, inputs, dev, None, "bias", kj, best)
                    times.append(t.median_us)
                inputs.close()
                row = {"key": name, "round": rnd, "warm_ms": w, "us": times,
                       "first_over_twin": times[0] / times[2]}
                out.append(row)
                print(f"{name:16s} round {rnd} warm {w:5.0f} ms: " + " ".join(
                    f"{t:8.1f}" for t in times) + f"  first/twin {row['first_over_twin']:.3f}",
                    flush=True)
    Path(args.out).write_text(json.dumps({"config": "heuristic", "rows": out}, indent=1))


if __name__ == "__main__":
    main()
