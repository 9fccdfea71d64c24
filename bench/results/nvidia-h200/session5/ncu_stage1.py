"""Run the b32 x 16k MLA heuristic a few times (for ncu)."""
import sys
from pathlib import Path
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import torch
from bench_decode import Shape, make_sets
from kdispatch.device import Device
from kdispatch.kernels.decode_attention import SPEC, launch_decode_attention
s = Shape("mla-b32-c16384", 32, 16, 1, 576, 512, 16384)
(inp,) = make_sets(s, 1, seed=1)
cfg = SPEC.heuristic(SPEC.key(Device.from_torch("cuda"), inp))
print(cfg)
for merge in (False, True):
    c = cfg.model_copy(update={"merge": merge})
    for _ in range(3):
        launch_decode_attention(c, **inp)
torch.cuda.synchronize()
