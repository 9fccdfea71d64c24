"""Session 31, call 2: choose the narrow fp8 tile's default score form from this call's
measurements, before the tune. e4m3 scores (F16_QK False, chunked fp32 sums) become the
default only when (a) at every replay of the precision probe their error is within 1.5x
(+0.002) of the 64-row tile's, and (b) over narrow_check's cases the geometric mean of
(best e4m3 time / best fp16 time, each over its split counts) is below 0.98. Prints the
decision; exits 0 to flip the default, 1 to keep fp16."""
import json, math, sys

prec = json.load(open(sys.argv[1]))
bad = [r for r in prec if r["narrow-e4m3"] > 1.5 * r["gluon64"] + 2e-3]
ratios = []
try:
    for c in json.load(open(sys.argv[2]))["cases"]:
        e = min(v for k, v in c["us"].items() if k.startswith("narrow-e4m3"))
        f = min(v for k, v in c["us"].items() if k.startswith("narrow-s"))
        ratios.append(e / f)
        print(f"{c['case']}: e4m3 / fp16 best {e:.1f} / {f:.1f} us = {e / f:.3f}")
except (OSError, ValueError) as exc:
    print("no timing:", exc)
gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0
print(f"precision: {len(bad)} of {len(prec)} replays out of bounds; speed: geomean {gm:.3f}")
flip = not bad and gm < 0.98
print("decision:", "e4m3 scores (F16_QK = False)" if flip else "fp16 scores (F16_QK = True)")
sys.exit(0 if flip else 1)
