"""The native launch cache on the GPU: torch.ops.kdispatch.write_kv launched from C++ gives
the public function's bits, re-checks every layout (a stale entry never launches with
other strides), counts its calls in stats(), captures into CUDA graphs and never syncs.

Each test runs a script in a fresh process that loads a library built for this test
session (the import decides which kernel the op gets)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU: run on the device machine")]

ROOT = Path(__file__).resolve().parents[2]


_SETUP = """
import torch, kdispatch
from kdispatch.native import ops as nops
kdispatch.load_torch_ops()
OP = "kdispatch::write_kv"
assert nops.installed(OP)
dev = "cuda"

def caches(dtype, nb=64, page=16, h=8, d=128, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    kc = torch.randn(nb, page, h, d, device=dev, dtype=dtype, generator=g)
    return kc, torch.randn(nb, page, h, d, device=dev, dtype=dtype, generator=g)

def rows(t, dtype, h=8, d=128, seed=1, strided=False):
    g = torch.Generator(device=dev).manual_seed(seed)
    if strided:  # K and V as views into one projection, as a serving layer passes them
        qkv = torch.randn(t, 3 * h * d, device=dev, dtype=dtype, generator=g)
        return qkv[:, h * d:2 * h * d].view(t, h, d), qkv[:, 2 * h * d:].view(t, h, d)
    return (torch.randn(t, h, d, device=dev, dtype=dtype, generator=g),
            torch.randn(t, h, d, device=dev, dtype=dtype, generator=g))

def slots(t, nb=64, page=16, seed=2):
    g = torch.Generator(device=dev).manual_seed(seed)
    s = torch.randperm(nb * page, device=dev, generator=g)[:t]
    if t > 2:
        s[1] = -1  # a skipped row
    return s
"""


def run(code: str, native_dir: Path) -> str:
    env = {**os.environ, "KDISPATCH_NATIVE_DIR": str(native_dir)}
    env.pop("TRITON_INTERPRET", None)
    env.pop("KDISPATCH_FAST_OPS", None)
    proc = subprocess.run([sys.executable, "-c", _SETUP + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_native_writes_match_the_public_function_and_recheck_layouts(native_dir):
    out = run("""
    bad, layouts = [], set()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for t in (1, 15, 16, 17, 64, 65):
            for strided in (False, True):
                for rep in range(3):  # the first call misses, the others launch from C++
                    k, v = rows(t, dtype, seed=rep + 10 * t, strided=strided)
                    s = slots(t, seed=rep + t)
                    kc, vc = caches(dtype)
                    kc2, vc2 = kc.clone(), vc.clone()
                    layouts.add((dtype, k.shape, k.stride(), v.stride()))
                    torch.cuda.set_sync_debug_mode("error")
                    torch.ops.kdispatch.write_kv(k, v, kc, vc, s)
                    torch.cuda.set_sync_debug_mode(0)
                    kdispatch.write_kv(k, v, kc2, vc2, s)
                    if not (torch.equal(kc, kc2) and torch.equal(vc, vc2)):
                        bad.append((str(dtype), t, strided, rep))
    print("bad", bad)
    print("entries", nops.entries(OP), len(layouts))
    """, native_dir)
    assert "bad []" in out
    # one entry per distinct layout: 3 dtypes x 6 token counts x 2 row strides, less the
    # one-token views, whose size-1 dim's stride torch's view makes the contiguous one's
    assert "entries 33 33" in out


def test_stats_count_native_calls_and_reset_drops_entries(native_dir):
    out = run("""
    k, v = rows(4, torch.bfloat16)
    kc, vc = caches(torch.bfloat16)
    s = slots(4)
    torch.ops.kdispatch.write_kv(k, v, kc, vc, s)  # the miss: resolves and remembers
    before = kdispatch.stats().resolutions
    for _ in range(25):
        torch.ops.kdispatch.write_kv(k, v, kc, vc, s)
    print("counted", kdispatch.stats().resolutions - before, nops.entries(OP))
    kdispatch.reset_dispatcher()
    print("after reset", nops.entries(OP))
    torch.ops.kdispatch.write_kv(k, v, kc, vc, s)
    print("again", nops.entries(OP))
    """, native_dir)
    assert "counted 25 1" in out and "after reset 0" in out and "again 1" in out


def test_native_launch_in_a_cuda_graph_replays_new_rows_and_slots(native_dir):
    out = run("""
    t = 16
    k, v = rows(t, torch.bfloat16)
    kc, vc = caches(torch.bfloat16)
    s = slots(t)
    torch.ops.kdispatch.write_kv(k, v, kc, vc, s)  # remembered before the capture
    n = nops.entries(OP)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.kdispatch.write_kv(k, v, kc, vc, s)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.kdispatch.write_kv(k, v, kc, vc, s)
    bad = 0
    for i in range(4):
        nk, nv = rows(t, torch.bfloat16, seed=100 + i)
        k.copy_(nk); v.copy_(nv); s.copy_(slots(t, seed=200 + i))
        ref_k, ref_v = kc.clone(), vc.clone()
        kdispatch.write_kv(k, v, ref_k, ref_v, s)
        graph.replay()
        torch.cuda.synchronize()
        bad += not (torch.equal(kc, ref_k) and torch.equal(vc, ref_v))
    print("replays bad", bad, "entries", n, nops.entries(OP))
    """, native_dir)
    assert "replays bad 0 entries 1 1" in out


_DECODE = """
def decode_inputs(kind, b, ctx, seed=0, page=16):
    g = torch.Generator(device=dev).manual_seed(seed)
    pages = -(-ctx // page)
    nb = b * pages + 3
    if kind == "mla":
        hq, dk, dv = 16, 576, 512
        q = torch.randn(b, hq, dk, device=dev, dtype=torch.bfloat16, generator=g)
        kc = torch.randn(nb, page, 1, dk, device=dev, dtype=torch.bfloat16, generator=g)
        vc = kc[..., :dv]
    else:
        q = torch.randn(b, 32, 128, device=dev, dtype=torch.bfloat16, generator=g)
        kc = torch.randn(nb, page, 8, 128, device=dev, dtype=torch.bfloat16, generator=g)
        vc = torch.randn(nb, page, 8, 128, device=dev, dtype=torch.bfloat16, generator=g)
    bt = torch.randperm(nb, device=dev, generator=g)[:b * pages].view(b, pages).int()
    sl = torch.randint(1, ctx + 1, (b,), device=dev, generator=g).int()
    sl[0] = ctx
    return q, kc, vc, bt, sl
"""


def test_native_decode_matches_the_public_function(native_dir):
    out = run(_DECODE + textwrap.dedent("""
    DOP = "kdispatch::decode_attention"
    bad, served = [], []
    for kind in ("gqa", "mla"):
        for b, ctx in ((1, 17), (3, 65), (8, 4096), (2, 32768), (32, 1024)):
            q, kc, vc, bt, sl = decode_inputs(kind, b, ctx)
            ref = kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.07)
            before = nops.entries(DOP)
            before_out = nops.entries(DOP + "_out")
            given = torch.empty_like(ref)
            for rep in range(3):
                sl = torch.randint(1, ctx + 1, (b,), device=dev, dtype=torch.int32)
                want = kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.07)
                torch.cuda.set_sync_debug_mode("error")
                got = torch.ops.kdispatch.decode_attention(q, kc, vc, bt, sl, 0.07)
                torch.ops.kdispatch.decode_attention_out(q, kc, vc, bt, sl, 0.07, out=given)
                torch.cuda.set_sync_debug_mode(0)
                if not (torch.equal(got, want) and torch.equal(given, want)):
                    bad.append((kind, b, ctx, rep))
            served.append(nops.entries(DOP) - before)
            served.append(nops.entries(DOP + "_out") - before_out)
    print("bad", bad)
    print("served", served)
    """), native_dir)
    assert "bad []" in out
    assert f"served {[1] * 20}" in out  # one entry per layout and form


def test_native_decode_replays_in_a_graph_and_counts(native_dir):
    out = run(_DECODE + textwrap.dedent("""
    q, kc, vc, bt, sl = decode_inputs("mla", 8, 4096)
    torch.ops.kdispatch.decode_attention(q, kc, vc, bt, sl, 0.07)  # remembered
    before = kdispatch.stats().resolutions
    for _ in range(10):
        torch.ops.kdispatch.decode_attention(q, kc, vc, bt, sl, 0.07)
    counted = kdispatch.stats().resolutions - before
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.kdispatch.decode_attention(q, kc, vc, bt, sl, 0.07)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = torch.ops.kdispatch.decode_attention(q, kc, vc, bt, sl, 0.07)
    bad = 0
    for i in range(4):
        sl.copy_(torch.randint(1, 4097, (8,), device=dev, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        want = kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.07)
        bad += not torch.equal(o, want)
    print("counted", counted, "graph bad", bad)
    """), native_dir)
    assert "counted 10 graph bad 0" in out
