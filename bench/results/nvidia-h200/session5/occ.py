"""b32 x 16k MLA: register cap / tile / split variants (occupancy), whole op. Ran at commit e479e3c (DecodeConfig.max_regs existed there; removed after this run)."""
import json, sys
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import torch
from bench_decode import Shape, make_sets, live_bytes, read_ceiling, time_config
from kdispatch.device import Device
from kdispatch.kernels.decode_attention import DecodeConfig, launch_decode_attention, reference_decode_attention
dev = Device.from_torch("cuda")
ceil = read_ceiling(dev.cu_count)["gbs"]
res = {"ceiling": ceil, "rows": []}
for name, b, ctx in (("mla-b32-c16384", 32, 16384), ("mla-b8-c327600", 8, 327600)):
    s = Shape(name, b, 16, 1, 576, 512, ctx)
    (inp,) = make_sets(s, 1, seed=3)
    ref = reference_decode_attention(**inp)
    V = [(8, 32, 4, 3, None), (8, 32, 4, 3, 168), (12, 32, 4, 2, 168), (12, 32, 4, 2, None),
         (12, 16, 4, 4, 168), (12, 16, 4, 4, None), (12, 16, 4, 5, 168), (16, 16, 4, 4, 128),
         (12, 16, 4, 3, 168), (8, 16, 4, 4, None)]
    if b == 8:
        V = [(33, 32, 4, 3, None), (49, 16, 4, 4, 168), (49, 32, 4, 2, 168), (49, 16, 4, 5, 168)]
    for sp, bn, w, st, mr in V:
        for pdl in (False, True):
            cfg = DecodeConfig(num_kv_splits=sp, block_n=bn, block_h=16, num_warps=w, num_stages=st, max_regs=mr, pdl=pdl)
            try:
                out = launch_decode_attention(cfg, **inp); torch.cuda.synchronize()
                ok = torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)
                us = time_config(cfg, [inp])[0] if ok else float("nan")
            except Exception as e:
                ok, us = str(e)[:60], float("nan")
            pct = 100 * live_bytes(s) / us / 1e3 / ceil
            res["rows"].append({"shape": name, "config": cfg.model_dump(), "ok": ok, "us": us, "pct": pct})
            print(f"{name} s{sp:3d} bn{bn} w{w} st{st} mr{mr} pdl{int(pdl)}: {us:8.1f} us {pct:5.1f}% ok={ok}", flush=True)
    del inp, ref; torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
