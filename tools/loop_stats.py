"""The main loop of a compiled decode stage 1, counted: instructions a warp, MMAs, and the
shared-memory bytes a tile moves per byte of cache it reads, on a machine without a GPU.

A decode tile reads ``block_n`` tokens of the cache; what its loop does with them in shared
memory (async copies in, ``ldmatrix`` / plain loads out, staging stores) bounds it before
DRAM does when that traffic is several times the cache bytes (docs/decode_notes.md v28:
the narrow latent tile moves 12.0 shared bytes per cache byte with an fp8 cache, 5.2 with
bf16, so fp8 cannot outrun bf16 there). Counted from the SASS (Triton's cuobjdump): the
loop is the backward branch's span holding the most MMA instructions, each shared-memory
instruction counts its width times 32 lanes times the program's warps (requested bytes,
predicated or not; bank conflicts not included). Triton stage-1 kernels only (the Gluon
tile's loops live in warp-specialized partitions)::

    python tools/loop_stats.py --preset kimi-k3-tp8                 # the preset's keys
    python tools/loop_stats.py --preset llama3-8b --kv float8_e4m3fn

Run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (compile_check clears TRITON_INTERPRET: the kernels must be JIT functions to compile)
from compile_check import compile_launch, decode_launches, disassemble  # noqa: E402

from kdispatch.device import Device  # noqa: E402
from kdispatch.dtypes import itemsize  # noqa: E402
from kdispatch.kernels.decode_attention import OP  # noqa: E402
from kdispatch.registry import all_ops  # noqa: E402
from kdispatch.tuning.presets import expand  # noqa: E402

_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(0x[0-9a-f]+)")
#: shared-memory instruction kinds: async copies in, loads out, stores
KINDS = {"LDGSTS": "copy", "LDSM": "load", "LDS": "load", "STSM": "store", "STS": "store"}


def opcode(instr: str) -> str:
    """An instruction's opcode with its modifiers (``LDS.U16``), its predicate dropped."""
    return re.sub(r"^@!?U?P\w+\s+", "", instr).split()[0]


def main_loop(sass: str) -> list[str]:
    """The instructions of the loop (the span of a backward branch) holding the most MMA
    instructions (``HMMA`` / ``HGMMA``); empty when there is none."""
    instrs = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, sass.splitlines())
              if m]
    loops = [(int(b.group(1), 16), at) for at, text in instrs
             for b in [_BRANCH.search(text)] if b and int(b.group(1), 16) < at]

    def mmas(span):
        return sum(1 for at, text in instrs if span[0] <= at <= span[1] and "MMA" in opcode(text))

    best = max(loops, key=mmas, default=None)
    if best is None or mmas(best) == 0:
        return []
    return [text for at, text in instrs if best[0] <= at <= best[1]]


def lane_bytes(op: str) -> int:
    """Bytes a lane moves in shared-memory instruction ``op`` (``LDSM`` ``.x4``: four 8x8
    16-bit matrices, 16 bytes a lane)."""
    if op.startswith(("LDSM", "STSM")):
        return 4 * int(op.rsplit(".", 1)[1])
    for suffix, width in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1),
                          (".S8", 1)):
        if suffix in op:
            return width
    return 4


def shared_bytes(loop: list[str], warps: int) -> dict[str, int]:
    """Shared-memory bytes the loop's instructions request in one pass, by kind."""
    out: Counter[str] = Counter()
    for text in loop:
        op = opcode(text)
        kind = next((k for prefix, k in KINDS.items() if op.startswith(prefix)), None)
        if kind is not None:
            out[kind] += lane_bytes(op) * 32 * warps
    return dict(out)


def stage1_stats(key, config, arch: int = 90) -> dict:
    """The main loop of ``config``'s stage 1 at ``key`` compiled for ``sm_<arch>``:
    instructions a warp, MMAs, shared bytes by kind and per cache byte of a tile."""
    launch = decode_launches(key, config.model_copy(update={"pdl": False}))[0]
    loop = main_loop(disassemble(compile_launch(launch, arch), "cuobjdump"))
    warps = config.num_warps
    moved = shared_bytes(loop, warps)
    row = key.head_dim + (0 if key.latent else key.head_dim_v)
    cache = config.block_n * row * itemsize(key.kv_dtype)
    return {"instructions": len(loop), "mma": sum("MMA" in opcode(t) for t in loop),
            "shared_bytes": moved, "cache_bytes": cache,
            "shared_per_cache_byte": sum(moved.values()) / cache}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="kimi-k3-tp8", help="presets whose decode keys to count")
    ap.add_argument("--kv", default="", help="only keys of this cache dtype")
    ap.add_argument("--device", default="nvidia-h200", help="device key of the configs")
    ap.add_argument("--arch", type=int, default=90, help="sm_<arch> to compile for")
    args = ap.parse_args(argv)
    dev = Device.from_key(args.device)
    for entry in expand(args.preset.split(","), all_ops()):
        if entry.op != OP.name:
            continue
        key = OP.key(dev, {"device": dev.key, **entry.args})
        cfg = OP.heuristic(key)
        if (args.kv and key.kv_dtype != args.kv) or cfg.kernel != "triton":
            continue
        s = stage1_stats(key, cfg, args.arch)
        kinds = ", ".join(f"{k} {v / 1024:.1f} KB" for k, v in sorted(s["shared_bytes"].items()))
        print(f"{key.num_q_heads}/{key.num_kv_heads} x {key.head_dim} {key.kv_dtype} "
              f"q{key.q_len} b{key.batch} x {key.context}: {cfg.block_h} rows, "
              f"{cfg.block_n} tokens, {cfg.num_warps} warps; loop {s['instructions']} "
              f"instructions a warp, {s['mma']} MMA; shared {kinds}; "
              f"{s['shared_per_cache_byte']:.1f} per cache byte", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
