"""Plot the split count the dispatcher chooses against batch and context (MLA and GQA).

    python tools/plot_splits.py --device nvidia-h200 --out docs/splits-nvidia-h200.png

Resolves on the host (plain form), so it runs anywhere: tuned keys come from the shipped
table (provenance ``table``, drawn as filled markers), the rest from the heuristic (hollow).
Needs matplotlib (``pip install "kdispatch[plot]"``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import kdispatch  # noqa: E402

SHAPES = {
    "kimi-k3 TP8 MLA (12 q heads, 576/512)": (
        dict(num_q_heads=12, num_kv_heads=1, head_dim=576, head_dim_v=512),
        (4096, 16384, 65536, 327600)),
    "llama3-8b GQA (32/8 heads, 128)": (
        dict(num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128),
        (8192, 32768, 131072, 262144)),
}
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="nvidia-h200")
    ap.add_argument("--out", default="docs/splits-nvidia-h200.png")
    args = ap.parse_args()
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(12, 4.5), sharey=True)
    for ax, (title, (heads, contexts)) in zip(axes, SHAPES.items()):
        for ci, ctx in enumerate(contexts):
            xs, ys, tabled = [], [], []
            for b in BATCHES:
                e = kdispatch.explain("decode_attention", device=args.device, batch=b,
                                      context=ctx, page_size=16, dtype="bfloat16", **heads)
                xs.append(b)
                ys.append(e.config.num_kv_splits)
                tabled.append(e.origin in ("table", "database"))
            line, = ax.plot(xs, ys, label=f"context {ctx:,}")
            for x, y, t in zip(xs, ys, tabled):
                # shrinking markers keep coinciding points of several contexts visible
                ax.plot([x], [y], "o", color=line.get_color(), markersize=11 - 2 * ci,
                        markerfacecolor=line.get_color() if t else "white")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("NUM_KV_SPLITS")
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"Split count chosen on {args.device} (filled: tuned table, hollow: heuristic)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
