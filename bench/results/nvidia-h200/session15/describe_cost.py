"""Session 15: what describing each llama3-8b key costs the timing process, outside a tune.

For each key of the preset (6 candidates each, as ``--max-candidates 6``): the host time of
``make_inputs`` (what a describe waits for; the GPU work it queued is timed apart, up to a
synchronize), then the host time of the candidates' ``launches`` and their LaunchSpecs
(``describe``). One line per key, then the totals. Session 14's guess: the 16,384-token KV
writes, whose inputs are drawn on the host, are the describes that outlast a wait.

    python3 bench/results/nvidia-h200/session15/describe_cost.py --device cuda:0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--max-candidates", type=int, default=6)
    a = ap.parse_args()

    import torch

    from kdispatch.registry import get_op
    from kdispatch.tuning.devices import resolve_device
    from kdispatch.tuning.inputs import storage_bytes
    from kdispatch.tuning.plan import candidate_list, plan
    from kdispatch.tuning.precompile import current_target, describe

    dev, tdev = resolve_device(a.device)
    target = current_target()
    targets, _ = plan(dev, [a.preset])
    total = {"make": 0.0, "gpu": 0.0, "describe": 0.0}
    print(f"{'key':>3} {'op':18s} {'inputs GB':>9} {'make s':>7} {'+GPU s':>7} "
          f"{'describe s':>10}  shape")
    for i, t in enumerate(targets):
        op = get_op(t.op)
        key = op.parse_key(t.key)
        cands = candidate_list(op, key, a.max_candidates)
        torch.cuda.synchronize()
        t0 = time.monotonic()
        inputs = op.tuning.make_inputs(key, tdev, 0)
        t1 = time.monotonic()
        torch.cuda.synchronize()
        t2 = time.monotonic()
        specs = 0
        for cfg, _ in cands:
            try:
                specs += sum(describe(x, target) is not None
                             for x in op.tuning.launches(cfg, inputs))
            except Exception as exc:  # noqa: BLE001 - as CompileAhead: left to the JIT
                print(f"    {cfg}: not described: {exc}")
        t3 = time.monotonic()
        size = storage_bytes(inputs) / 1e9
        del inputs
        total["make"] += t1 - t0
        total["gpu"] += t2 - t1
        total["describe"] += t3 - t2
        shape = {k: v for k, v in t.key.items() if k in ("batch", "context", "tokens",
                                                         "kv_dtype")}
        print(f"{i:3d} {t.op:18s} {size:9.2f} {t1 - t0:7.3f} {t2 - t1:7.3f} {t3 - t2:10.3f}  "
              f"{shape} ({specs} launches)", flush=True)
    torch.cuda.empty_cache()
    print(f"total: make_inputs {total['make']:.2f} s on the host (+{total['gpu']:.2f} s "
          f"until the GPU was done), launches described in {total['describe']:.2f} s")


if __name__ == "__main__":
    main()
