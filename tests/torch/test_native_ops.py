"""The native launch cache (kdispatch.native): build, load, install on write_kv, the slots it
packs and the layouts it refuses. No GPU: the CUDA launch itself is tested in
tests/gpu/test_native_gpu.py; here entries are added with CPU tensors and checked with
``probe`` (what a call would launch: the entry and every parameter slot)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from click.testing import CliRunner

from kdispatch.cli import main
from kdispatch.native import build as nbuild
from kdispatch.native import ops as nops

ROOT = Path(__file__).resolve().parents[2]


def run_py(code: str, native_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, nbuild.NATIVE_DIR_ENV: str(native_dir), "TRITON_INTERPRET": "1",
            **env}
    return subprocess.run([sys.executable, "-W", "error::UserWarning", "-c",
                           textwrap.dedent(code)], env=full, capture_output=True, text=True,
                          cwd=ROOT)


def test_library_path_holds_a_digest_of_source_and_torch(monkeypatch, tmp_path):
    monkeypatch.setenv(nbuild.NATIVE_DIR_ENV, str(tmp_path))
    p = nbuild.library_path()
    assert p.parent == tmp_path and p.name.startswith("kdispatch_native-")
    monkeypatch.setattr(nbuild, "_abi", lambda: "other-torch")
    assert nbuild.library_path() != p


def test_build_without_a_compiler_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(nbuild.NATIVE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(nbuild.NativeBuildError, match="no C\\+\\+ compiler: .*no-such-c\\+\\+"):
        nbuild.build()
    r = CliRunner().invoke(main, ["build-ops"])
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert "no C++ compiler" in r.output and "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []  # no partial library left behind


def test_compiler_error_is_one_line_naming_the_error(monkeypatch, tmp_path):
    monkeypatch.setenv(nbuild.NATIVE_DIR_ENV, str(tmp_path))
    bad = tmp_path / "bad.cpp"
    bad.write_text("int main( {\n")
    monkeypatch.setattr(nbuild, "SOURCE", bad)
    with pytest.raises(nbuild.NativeBuildError, match="the compiler failed .*error"):
        nbuild.build()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.cpp"]


def test_build_ops_help_has_an_example():
    r = CliRunner().invoke(main, ["build-ops", "--help"])
    assert r.exit_code == 0 and "Example:" in r.output and "kdispatch build-ops" in r.output


def test_build_ops_reuses_and_forces(native_dir, monkeypatch):
    monkeypatch.setenv(nbuild.NATIVE_DIR_ENV, str(native_dir))
    path = nbuild.library_path()
    before = path.stat().st_mtime_ns
    assert nbuild.build() == path and path.stat().st_mtime_ns == before
    r = CliRunner().invoke(main, ["build-ops", "--force"])
    assert r.exit_code == 0 and r.output.strip() == f"built {path}"
    assert path.stat().st_mtime_ns != before


_SETUP = """
import torch, kdispatch
from types import SimpleNamespace as NS
kdispatch.load_torch_ops()
from kdispatch.native import ops as nops
from kdispatch.native.build import loaded
OP = "kdispatch::write_kv"
"""


def test_write_kv_runs_through_the_cache_where_built(native_dir):
    code = _SETUP + textwrap.dedent("""
    dump = torch._C._dispatch_dump("kdispatch::write_kv")
    cuda = [ln for ln in dump.splitlines() if ln.startswith("CUDA")]
    print(loaded() is not None, nops.installed(OP), nops.entries(OP))
    print("launch_cache.cpp" in cuda[0], "kdispatch::_write_kv_slow" in
          torch._C._dispatch_get_all_op_names())
    # CPU calls keep the Python kernel (the interpreter): bits as the public function
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    kc, vc = torch.randn(4, 16, 2, 16), torch.randn(4, 16, 2, 16)
    s = torch.tensor([0, 17, 63])
    kc2, vc2 = kc.clone(), vc.clone()
    torch.ops.kdispatch.write_kv(k, v, kc, vc, s)
    kdispatch.write_kv(k, v, kc2, vc2, s)
    print(torch.equal(kc, kc2) and torch.equal(vc, vc2),
          torch.equal(kc.view(-1, 2, 16)[s], k))
    """)
    r = run_py(code, native_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "0", "True", "True", "True", "True"]


def test_decode_runs_through_the_cache_where_built(native_dir):
    code = _SETUP + textwrap.dedent("""
    names = torch._C._dispatch_get_all_op_names()
    for name in ("decode_attention", "decode_attention_out"):
        op = "kdispatch::" + name
        cuda = [ln for ln in torch._C._dispatch_dump(op).splitlines() if ln.startswith("CUDA")]
        print(nops.installed(op), "launch_cache.cpp" in cuda[0],
              f"kdispatch::_{name}_slow" in names)
    q = torch.randn(2, 4, 32)
    kc, vc = torch.randn(4, 16, 2, 32), torch.randn(4, 16, 2, 32)
    bt = torch.arange(4, dtype=torch.int32).view(2, 2)
    sl = torch.tensor([1, 17], dtype=torch.int32)
    a = torch.ops.kdispatch.decode_attention(q, kc, vc, bt, sl, 0.2)
    b = kdispatch.decode_attention(q, kc, vc, bt, sl, scale=0.2)
    c = torch.empty_like(a)
    torch.ops.kdispatch.decode_attention_out(q, kc, vc, bt, sl, 0.2, out=c)
    print(torch.equal(a, b), torch.equal(c, b))
    """)
    r = run_py(code, native_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"] * 8


def test_fast_ops_off_keeps_the_python_kernel(native_dir):
    code = _SETUP + textwrap.dedent("""
    dump = torch._C._dispatch_dump("kdispatch::write_kv")
    cuda = [ln for ln in dump.splitlines() if ln.startswith("CUDA")]
    print(loaded() is None, nops.installed(OP), "launch_cache.cpp" in cuda[0],
          "kdispatch::_write_kv_slow" in torch._C._dispatch_get_all_op_names(),
          nops.installed("kdispatch::decode_attention"),
          "kdispatch::_decode_attention_slow" in torch._C._dispatch_get_all_op_names(),
          nops.installed("kdispatch::decode_attention_out"))
    """)
    r = run_py(code, native_dir, KDISPATCH_FAST_OPS="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"] + ["False"] * 6


def test_a_library_that_fails_to_load_warns_once(native_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    env = {nbuild.NATIVE_DIR_ENV: str(bad)}
    name = subprocess.run([sys.executable, "-c", "from kdispatch.native.build import "
                           "library_path; print(library_path().name)"],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()
    (bad / name).write_bytes(b"not a shared library")
    code = """
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import torch, kdispatch
        kdispatch.load_torch_ops()
        from kdispatch.native import ops as nops
        from kdispatch.native.build import load
        print(load(), nops.installed("kdispatch::write_kv"))
    msgs = [str(x.message) for x in w if "native launch cache" in str(x.message)]
    print(len(msgs), "failed to load" in msgs[0], "build-ops" in msgs[0])
    k = torch.randn(1, 2, 16)
    kc = torch.zeros(2, 16, 2, 16)
    torch.ops.kdispatch.write_kv(k, k, kc, kc.clone(), torch.tensor([5]))
    print(torch.equal(kc[0, 5], k[0]))
    """
    r = run_py(textwrap.dedent(code), native_dir, **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "1", "True", "True", "True"]


# A compiled kernel as the native cache reads it: the writer's 9 pointers and 14 integers
# (one of them specialized to a constexpr, as Triton does for an integer equal to 1), then
# its constexprs.
def _compiled(**md):
    meta = dict(num_ctas=1, launch_cooperative_grid=False, global_scratch_size=0,
                profile_scratch_size=0, num_warps=4, shared=128, launch_pdl=True)
    sig = {f"p{j}": "*bf16" for j in range(9)}
    sig |= {f"i{j}": "constexpr" if j == 3 else ("i64" if j == 5 else "i32")
            for j in range(14)}
    sig |= {"NUM_HEADS": "constexpr", "BLOCK_T": "constexpr"}
    return NS(metadata=NS(**{**meta, **md}), src=NS(signature=sig))


ARGS = [("tensor", i) for i in (0, 1, 2, 3, 4, 4, 4, 4, 4)] + [100 + j for j in range(13)] \
    + [-(2 ** 40)]


def test_slots_follow_the_launchers_parameters():
    kinds, values = nops.slots_of(_compiled(), ARGS)
    assert kinds == [0, 1, 2, 3, 4, 4, 4, 4, 4] + [-1] * 13 + [-1, -1]
    # integer 3 is a constexpr (not a launcher parameter); the scratch pointers are null
    assert values == [0] * 9 + [100, 101, 102, 104, 105, 106, 107, 108, 109, 110, 111, 112,
                                -(2 ** 40)] + [0, 0]


@pytest.mark.parametrize("md,args", [
    ({"num_ctas": 2}, ARGS), ({"launch_cooperative_grid": True}, ARGS),
    ({"global_scratch_size": 64}, ARGS), ({"profile_scratch_size": 8}, ARGS),
    ({}, ARGS[:5] + [7] + ARGS[6:]),              # an integer where a pointer is expected
    ({}, ARGS[:10] + [("tensor", 0)] + ARGS[11:]),  # a tensor where an integer is expected
    ({}, ARGS[:10] + [0.5] + ARGS[11:]),          # a float argument
    ({}, ARGS[:-1]),                              # a runtime parameter left without a value
])
def test_slots_refuse_what_the_native_launch_does_not_do(md, args):
    assert nops.slots_of(_compiled(**md), args) is None


_ADD = """
def add(tensors, args, **kw):
    comp = NS(metadata=NS(num_ctas=1, launch_cooperative_grid=False, global_scratch_size=0,
                          profile_scratch_size=0, num_warps=4, shared=0, launch_pdl=False),
              src=NS(signature=kw.pop("sig")))
    return nops.add_launches(OP, tensors, [nops.NativeLaunch(comp, 1234, (3, 1), args)], **kw)

def probe(tensors, args=()):
    ints, allocs = torch.ops.kdispatch_native.probe(OP, list(tensors), list(args))
    return ints
"""


def test_probe_packs_pointers_and_refuses_other_layouts(native_dir):
    code = _SETUP + _ADD + textwrap.dedent("""
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    kc, vc = torch.randn(4, 16, 2, 16), torch.randn(4, 16, 2, 16)
    s = torch.tensor([0, 17, 63])
    sig = {**{f"p{j}": "*fp32" for j in range(6)}, "n": "i32", "C": "constexpr"}
    eid = add((k, v, kc, vc, s), [("tensor", i) for i in (0, 1, 2, 3, 4, 4)] + [-7], sig=sig)
    ptrs = [t.data_ptr() for t in (k, v, kc, vc, s, s)]
    print(eid > 0, probe([k, v, kc, vc, s]) == [eid, *ptrs, -7, 0, 0], nops.entries(OP))
    # same layouts, other storage: the entry serves them with their own pointers
    k2, kc2 = torch.randn(3, 2, 16), torch.randn(4, 16, 2, 16)
    got = probe([k2, v, kc2, vc, s])
    print(got[:4] == [eid, k2.data_ptr(), v.data_ptr(), kc2.data_ptr()])
    big_off = torch.randn(3 * 32 + 1)[1:].view(3, 2, 16)
    others = {
        "dtype": [k.double(), v, kc, vc, s],
        "slot dtype": [k, v, kc, vc, s.int()],
        "shape": [k[:2], v, kc, vc, s],
        "stride": [torch.randn(2, 3, 16).transpose(0, 1), v, kc, vc, s],
        "cache stride": [k, v, torch.randn(4, 2, 16, 16).transpose(1, 2), vc, s],
        "rank": [k.view(3, 32), v, kc, vc, s],
        "unaligned": [big_off, v, kc, vc, s],
        "meta": [k.to("meta"), v, kc, vc, s],
        "shared pointer": [k, k, kc, vc, s],  # the entry's K and V pointers differ
        "count": [k, v, kc, vc],
    }
    print(big_off.data_ptr() % 16 != 0)
    print(" ".join(name for name, ts in others.items() if probe(ts) != [-1]) or "none")
    # an unaligned call is never added; a reset drops every entry
    print(add(others["unaligned"], [("tensor", 0)], sig={"p": "*fp32"}))
    kdispatch.reset_dispatcher()
    print(nops.entries(OP), probe([k, v, kc, vc, s]))
    """)
    r = run_py(code, native_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True True 1", "True", "True", "none", "None",
                                     "0 [-1]"]


def test_probe_packs_allocations_scalars_kept_pointers_and_two_launches(native_dir):
    code = _SETUP + _ADD + textwrap.dedent("""
    import struct
    q = torch.randn(2, 4, 16)
    kc = torch.randn(4, 16, 1, 16)
    v = kc[..., :8]                       # a view sharing K's pointer (the MLA latent)
    bt, sl = torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    zeros = torch.zeros(64)
    sig = {**{f"p{j}": "*fp32" for j in range(8)}, "qk": "fp32", "cap": "fp32", "n": "i64"}
    args = [("tensor", 0), ("tensor", 1), ("alloc", 0), ("alloc", 1), ("alloc", 1, 256),
            ("alloc", 2), ("ptr", zeros.data_ptr()), ("tensor", 4), ("scalar", 5, 1.5), 1.0,
            2 ** 40]
    allocs = [((2, 4, 8), torch.bfloat16, False), ((100,), torch.float32, False),
              ((2, 3), torch.int32, True)]
    eid = add((q, kc, v, bt, sl), args, sig=sig, keep=(zeros,), allocs=allocs, returns=0)
    ints, al = torch.ops.kdispatch_native.probe(OP, [q, kc, v, bt, sl],
                                                [0, 0, 0, 0, 0, 0.3])
    f32 = lambda x: struct.unpack("<I", struct.pack("<f", x))[0]
    want = [eid, q.data_ptr(), kc.data_ptr(), al[0].data_ptr(), al[1].data_ptr(),
            al[1].data_ptr() + 256, al[2].data_ptr(), zeros.data_ptr(), sl.data_ptr(),
            f32(0.3 * 1.5), f32(1.0), 2 ** 40, 0, 0]
    print(ints == want)
    print([(tuple(a.shape), a.dtype) for a in al] == [(s_, d) for s_, d, _ in allocs],
          bool((al[2] == 0).all()))
    # a non-finite or missing float argument, or K and V apart, is not served
    bad = [torch.ops.kdispatch_native.probe(OP, [q, kc, v, bt, sl], a)[0]
           for a in ([0] * 5 + [float("inf")], [0] * 5 + [float("nan")], [0] * 5)]
    apart = torch.ops.kdispatch_native.probe(OP, [q, kc, kc.clone()[..., :8], bt, sl],
                                             [0] * 5 + [0.3])[0]
    print(bad, apart)
    # refused entries: an allocation index past the list, a return past it
    print(add((q, kc, v, bt, sl), [("alloc", 3)], sig={"p": "*fp32"}, allocs=allocs),
          add((q, kc, v, bt, sl), [("alloc", 0)], sig={"p": "*fp32"}, allocs=allocs,
              returns=3))
    """)
    r = run_py(code, native_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True", "True True", "[[-1], [-1], [-1]] [-1]",
                                     "None None"]


def test_entries_are_bounded_and_counts_fold_into_stats(native_dir):
    code = _SETUP + _ADD + textwrap.dedent("""
    kc = torch.randn(4, 16, 2, 16)
    s = torch.tensor([1])
    for n in range(1, 66):
        k = torch.randn(n, 2, 16)
        add((k, k, kc, kc, s), [("tensor", i) for i in range(5)],
            sig={f"p{j}": "*fp32" for j in range(5)})
    print(nops.entries(OP))  # 64 at most: the 65th cleared the table first
    # stats() asks the library for its hit counts (none launched on a CPU) without error
    print(kdispatch.stats().resolutions)
    """)
    r = run_py(code, native_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "0"]


def test_doctor_names_the_caches_state(native_dir, monkeypatch, tmp_path):
    runner = CliRunner()

    def line() -> str:
        r = runner.invoke(main, ["doctor", "--db", str(tmp_path / "none.sqlite")])
        assert r.exit_code == 0, r.output
        return next(ln for ln in r.output.splitlines() if ln.startswith("native launch"))

    monkeypatch.setenv(nbuild.NATIVE_DIR_ENV, str(tmp_path / "empty"))
    assert "not built (`kdispatch build-ops` builds it)" in line()
    monkeypatch.setenv(nbuild.NATIVE_DIR_ENV, str(native_dir))
    assert line().startswith(f"native launch cache: built ({nbuild.library_path()})")
    monkeypatch.setenv(nbuild.FAST_OPS_ENV, "0")
    assert line() == "native launch cache: off (KDISPATCH_FAST_OPS=0)"
