"""tools/loop_stats.py: its SASS loop parser, and the narrow latent tile's shared-memory
traffic per cache byte that docs/decode_notes.md v28 reports (fp8 about twice bf16's).

The tool compiles without TRITON_INTERPRET (it clears the variable on import), so it runs
in a child process here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0020*/                   HMMA.16816.F32 R8, R12, R14, R8 ;
        /*0030*/              @P0 BRA 0x10 ;
        /*0040*/                   LDS.U16 R3, [R5] ;
        /*0050*/                   LDSM.16.MT88.4 R16, [R6] ;
        /*0060*/                   STS.128 [R7], R20 ;
        /*0070*/                   HMMA.16816.F32 R8, R12, R14, R8 ;
        /*0080*/                   HGMMA.64x16x16.F32 R24, R26, gdesc[UR8] ;
        /*0090*/              @!P1 BRA 0x40 ;
        /*00a0*/                   EXIT ;
"""


def _child(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tools"),
                                         env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_loop_with_the_most_mmas_and_its_shared_bytes():
    got = _child(f"""
import json, loop_stats as L
loop = L.main_loop({SASS!r})
print(json.dumps({{"ops": [L.opcode(t) for t in loop], "bytes": L.shared_bytes(loop, 4),
                   "none": L.main_loop("        /*0000*/ EXIT ;")}}))
""")
    # the second loop (0x40-0x90) holds two MMAs, the first one
    assert got["ops"] == ["LDS.U16", "LDSM.16.MT88.4", "STS.128", "HMMA.16816.F32",
                          "HGMMA.64x16x16.F32", "BRA"]
    # 32 lanes x 4 warps: LDS.U16 2 B + ldmatrix x4 16 B a lane; STS.128 16 B a lane
    assert got["bytes"] == {"load": (2 + 16) * 128, "store": 16 * 128}
    assert got["none"] == []


def test_the_narrow_latent_tile_moves_twice_the_shared_bytes_with_an_fp8_cache():
    got = _child("""
import json, loop_stats as L
from kdispatch.device import Device
from kdispatch.kernels.decode_attention import OP
dev = Device.from_key("nvidia-h200")
out = {}
for kv in ("bfloat16", "float8_e4m3fn"):
    key = OP.key(dev, {"device": dev.key, "batch": 8, "num_q_heads": 12, "num_kv_heads": 1,
                       "head_dim": 576, "head_dim_v": 512, "context": 393216,
                       "page_size": 16, "dtype": "bfloat16", "kv_dtype": kv})
    if kv == "bfloat16":  # the Triton narrow tile's config (an fp8 latent's heuristic on
        cfg = OP.heuristic(key)  # the H200 is the Gluon narrow tile since session 31)
    assert OP.is_valid(key, cfg) and cfg.kernel == "triton"
    out[kv] = L.stage1_stats(key, cfg)
print(json.dumps(out))
""")
    bf16, fp8 = got["bfloat16"], got["float8_e4m3fn"]
    assert bf16["mma"] == fp8["mma"] > 0 and bf16["instructions"] > 100
    # the fp8 tile is staged as fp16 (stores) after its async copy; bf16 is read in place
    assert fp8["shared_bytes"]["store"] > 4 * bf16["shared_bytes"].get("store", 0)
    assert fp8["cache_bytes"] * 2 == bf16["cache_bytes"]
    assert fp8["shared_per_cache_byte"] > 2 * bf16["shared_per_cache_byte"] > 6
