"""A tiny pure-torch op spec for testing the dispatcher, store and tables without kernels."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator

from kdispatch.buckets import pow2_bucket
from kdispatch.opdef import Op, OpConfig, OpKey, OpTuning, check_pow2


class ScaleKey(OpKey):
    dtype: Literal["float32", "float16", "bfloat16"]
    n: int = Field(ge=1, le=1 << 30)


class ScaleConfig(OpConfig):
    block: int = 64

    @field_validator("block")
    @classmethod
    def _block(cls, v: int) -> int:
        return check_pow2("block", v, 1, 4096)


class ScaleSpec(Op, OpTuning):
    """out = 2 * x; the config only changes how (not what) it computes."""

    name: ClassVar[str] = "fake_scale"
    key_model = ScaleKey
    config_model = ScaleConfig

    @property
    def tuning(self):  # one object plays both faces
        return self

    def memo_key(self, args: dict) -> Any:
        x = args.get("x")
        if x is not None:
            return (x.shape, x.dtype, x.device)
        return (args["device"], args["n"], args.get("dtype", "float32"))

    def device_of(self, args: dict) -> Any:
        x = args.get("x")
        return x.device if x is not None else args["device"]

    def key(self, device, args):
        x = args.get("x")
        if x is not None:
            n, dtype = x.numel(), str(x.dtype).removeprefix("torch.")
        else:
            n, dtype = int(args["n"]), args.get("dtype", "float32")
        return ScaleKey(**OpKey.device_fields(device), dtype=dtype, n=pow2_bucket(n))

    def heuristic(self, key):
        return ScaleConfig(block=64 if key.n >= 64 else 16, num_warps=4)

    def candidates(self, key):
        return [ScaleConfig(block=b, num_warps=w) for b in (16, 64, 256) for w in (2, 4)]

    def is_valid(self, key, config):
        return config.block <= max(16, key.n)

    def launch(self, config, x):
        return x * 2

    def make_inputs(self, key, device, seed):
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(key.n, generator=g).to(device)}

    def run(self, config, inputs):
        return self.launch(config, **inputs)

    def reference(self, inputs):
        return inputs["x"].float() * 2

    def tolerance(self, key):
        return (0.0, 0.0)

    def bytes_moved(self, key):
        return key.n * 8

    def source_hash(self) -> str:
        return "fake0001"


SPEC = ScaleSpec()
