"""What torch charges per call of a no-op op of write_kv's schema, by registration style
(A: CPU/CUDA kernels + Autograd fallthrough, as kdispatch registers; B: CompositeExplicitAutograd;
C: CompositeImplicitAutograd; D: no fallthrough; E: two overloads; F: ADInplaceOrView fallthrough
too; G: with_keyset), the packet against the overload, beside a plain Python call.

    python bench/results/nvidia-h200/session16/op_floor.py
"""
import time, torch, statistics
from torch.library import Library
dev = "cuda" if torch.cuda.is_available() else "cpu"
lib = Library("kdx", "FRAGMENT")
S = "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping) -> ()"
def noop(*a): return None
def fake(*a): return None
# A: CPU/CUDA + autograd fallthrough (current)
lib.define("a"+S); lib.impl("a", noop, "CPU"); lib.impl("a", noop, "CUDA"); lib.impl("a", torch.library.fallthrough_kernel, "Autograd")
# B: CompositeExplicitAutograd
lib.define("b"+S); lib.impl("b", noop, "CompositeExplicitAutograd")
# C: CompositeImplicitAutograd
lib.define("c"+S); lib.impl("c", noop, "CompositeImplicitAutograd")
# D: CPU only, no autograd fallthrough
lib.define("d"+S); lib.impl("d", noop, "CPU"); lib.impl("d", noop, "CUDA")
# E: two overloads like write_kv
lib.define("e"+S); lib.impl("e", noop, "CPU"); lib.impl("e", noop, "CUDA"); lib.impl("e", torch.library.fallthrough_kernel, "Autograd")
lib.define("e.full"+S.replace(") ->", ", Tensor? row_mask=None) ->")); lib.impl("e.full", noop, "CPU"); lib.impl("e.full", noop, "CUDA"); lib.impl("e.full", torch.library.fallthrough_kernel, "Autograd")
# F: ADInplaceOrView fallthrough too
lib.define("f"+S); lib.impl("f", noop, "CPU"); lib.impl("f", noop, "CUDA"); lib.impl("f", torch.library.fallthrough_kernel, "Autograd"); lib.impl("f", torch.library.fallthrough_kernel, "ADInplaceOrView")
# G: with_keyset
lib.define("g"+S); lib.impl("g", lambda ks,*a: None, "CUDA" if dev == "cuda" else "CPU", with_keyset=True); lib.impl("g", torch.library.fallthrough_kernel, "Autograd")
ops = torch.ops.kdx
dev = "cuda" if torch.cuda.is_available() else "cpu"
k = torch.randn(1,8,128,device=dev); v=torch.randn(1,8,128,device=dev); kc=torch.randn(8,16,8,128,device=dev); vc=torch.randn(8,16,8,128,device=dev); sl=torch.tensor([3],device=dev)
cases = {n: getattr(ops, n) for n in "abcdefg"}
cases["a.default"] = ops.a.default
cases["e.default"] = ops.e.default
cases["pyfn"] = noop
N=20000
res = {n: [] for n in cases}
for r in range(7):
    for n, f in cases.items():
        t=time.perf_counter_ns()
        for _ in range(N): f(k, v, kc, vc, sl)
        res[n].append((time.perf_counter_ns()-t)/N/1e3)
for n, s in res.items(): print(f"{n:10s} {statistics.median(s):.3f} {min(s):.3f}")
