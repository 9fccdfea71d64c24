"""Compile real kdispatch kernels for sm_90 in the pool, then ask Triton's JIT for them.

Run as a script in compiled mode (no ``TRITON_INTERPRET``), with ``TRITON_CACHE_DIR`` set:
it builds launches of both built-in ops on CPU tensors (one with a misaligned view), has a
:class:`~kdispatch.tuning.compile_pool.CompilePool` compile them for ``cuda`` sm_90 without
a GPU, then runs each launch's ``JITFunction.run(..., warmup=True)`` against a stand-in
driver whose current target is that GPU. The JIT computes its own cache key from the live
tensors: every kernel must be a cache hit (the pool compiled it under the same key) and
none compiled again. Prints one JSON line.

``bad_kernel`` does not compile (a non-power-of-two ``tl.arange``).
"""

from __future__ import annotations

import json
import os
import sys

import triton
import triton.language as tl

TARGET = ("cuda", 90, 32)


@triton.jit
def bad_kernel(x_ptr, n):
    offs = tl.arange(0, 3)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _launches():
    import torch

    from kdispatch.device import Device
    from kdispatch.kernels.decode_attention import launch as dl
    from kdispatch.registry import get_op

    dev = Device.from_key("nvidia-h200")
    kv = get_op("kv_write")
    key = kv.key(dev, kv.plain_args({"tokens": 8, "num_kv_heads": 8, "head_dim": 128,
                                     "page_size": 16, "dtype": "bfloat16"}))
    inputs = kv.tuning.make_inputs(key, torch.device("cpu"), 0)
    cfg = kv.heuristic(key).model_copy(update={"pdl": False})
    out = list(kv.tuning.launches(cfg, inputs))
    # the same write from a key view two bytes off 16-byte alignment: another variant
    shifted = torch.empty(inputs["key"].numel() + 1, dtype=torch.bfloat16)[1:]
    inputs["key"] = shifted.view(inputs["key"].shape).copy_(inputs["key"])
    out += kv.tuning.launches(cfg, inputs)
    # decode: the plan's launches directly (the op's own checks refuse CPU tensors when
    # the kernels are compiled: this process never runs them)
    dec = get_op("decode_attention")
    key = dec.key(dev, dec.plain_args({"batch": 2, "context": 256, "num_q_heads": 8,
                                       "num_kv_heads": 2, "head_dim": 128, "head_dim_v": 128,
                                       "page_size": 16, "dtype": "bfloat16"}))
    i = dec.tuning.make_inputs(key, torch.device("cpu"), 0)
    cfg = dec.heuristic(key).model_copy(update={"pdl": False, "merge": False,
                                                "num_kv_splits": 2})
    p = dl.checked_plan(cfg, i["q"], i["k_cache"], i["v_cache"], i["block_table"],
                        i["seq_lens"], None, 0.0)
    out += dl.launches(p, i["q"], i["k_cache"], i["v_cache"], i["block_table"], i["seq_lens"],
                       i["q"].new_empty(p.out_shape), i["scale"], 0.0, 0)
    return out


class _Driver:
    """What ``JITFunction.run`` asks of the active driver, for a GPU this host lacks."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(*TARGET)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0


def main() -> None:
    from triton.runtime import driver

    from kdispatch.tuning.compile_pool import CompilePool
    from kdispatch.tuning.precompile import count_compiles, describe

    launches = _launches()
    specs = [describe(launch, TARGET) for launch in launches]
    with CompilePool(2) as pool:
        pool.submit([(s.digest, s) for s in specs])
        outcomes = pool.wait([s.digest for s in specs], timeout=600)
    driver.set_active(_Driver())
    with count_compiles() as jit:
        for launch in launches:
            launch.fn.run(*launch.args, grid=launch.grid, warmup=True, **launch.constexprs,
                          **launch.options)
    print(json.dumps({
        "launches": len(launches), "variants": len({s.digest for s in specs}),
        "outcomes": sorted(o.status for o in outcomes.values()),
        "errors": sorted({o.error for o in outcomes.values() if o.error}),
        "jit_compiled": jit.compiled, "jit_cache_hits": jit.cache_hits,
        "cache_files": sum(len(f) for _, _, f in os.walk(os.environ["TRITON_CACHE_DIR"]))}))


if __name__ == "__main__":
    sys.exit(main())
