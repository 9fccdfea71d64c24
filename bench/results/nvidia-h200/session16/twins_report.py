"""Each shape against its length twin (``tools/bench_decode.py --twins``): which config is
best on full-context lengths, which on ragged lengths, and what each costs on the other.

    python bench/results/nvidia-h200/session16/twins_report.py call1-twins.json
"""

import json
import sys


def main(path: str) -> None:
    rows = json.load(open(path))["rows"]
    allt = {r["shape"]: r["extra"]["all"] for r in rows if r["label"] == "sweep-best"}
    heur = {r["shape"]: json.dumps(r["config"]) for r in rows if r["label"] == "heuristic"}
    print(f"{'shape':40s} {'best full':>40s} {'best ragged':>40s} "
          f"{'full-best on ragged':>8s} {'ragged-best on full':>8s} {'heur on ragged':>8s}")
    for name in list(allt):
        if name.endswith(("-rag", "-full")):
            continue
        if name + "-rag" in allt:
            fname, rname = name, name + "-rag"
        elif name + "-full" in allt:
            fname, rname = name + "-full", name
        else:
            continue
        full, rag = allt[fname], allt[rname]
        common = set(full) & set(rag)
        bf = min(common, key=lambda c: full[c])
        br = min(common, key=lambda c: rag[c])
        h = heur.get(rname)
        hr = rag[h] / rag[br] if h in rag else float("nan")

        def short(c):
            d = json.loads(c)
            return (f"s{d['num_kv_splits']} n{d['block_n']} h{d['block_h']} w{d['num_warps']}"
                    f" st{d['num_stages']}{' m' if d.get('merge') else ''}"
                    f"{' pdl' if d.get('pdl') else ''}{' gl' if d.get('kernel') == 'gluon' else ''}")
        print(f"{name:40s} {short(bf):>40s} {short(br):>40s} "
              f"{rag[bf] / rag[br]:8.3f} {full[br] / full[bf]:8.3f} {hr:8.3f}"
              f"   ({rag[br]:.1f} us ragged best, {full[bf]:.1f} us full best)")


if __name__ == "__main__":
    main(sys.argv[1])
