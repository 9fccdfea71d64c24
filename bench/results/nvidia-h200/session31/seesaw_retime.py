"""Session 31, call 3: session 31's tune had the bf16 seesaw at 128 heads b128 x 16,384
(64-token pages) 1.083x slower at its heuristic 2 splits than at 1 (1214.5 vs 1121.0 us);
session 29's tune, on the same seesaw code, 1082.8 vs 1095.5. Both split counts timed
again in one run, 4 alternating rounds of graph replays."""
import json, sys
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import torch
import kdispatch
from bench_decode import Shape, make_sets, time_fns
from kdispatch.kernels.decode_attention.spec import gluon_config

s = Shape("dp-b128", 128, 128, 1, 576, 512, 16384, page=64)
sets = make_sets(s, 2, 0)


def fn(inp, cfg):
    out = torch.empty(inp["q"].shape[:-1] + (512,), device="cuda", dtype=torch.bfloat16)
    return lambda: kdispatch.decode_attention(inp["q"], inp["k_cache"], inp["v_cache"],
                                              inp["block_table"], inp["seq_lens"],
                                              scale=inp["scale"], out=out, config=cfg)


fns = {f"s{sp}": [fn(i, gluon_config(sp)) for i in sets] for sp in (1, 2)}
fns["heuristic"] = [fn(i, None) for i in sets]
times = {k: [] for k in fns}
for r in range(4):
    for k in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
        times[k].append(time_fns(fns[k])[0])
med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
print(json.dumps({"median_us": med, "rounds": times}))
json.dump({"median_us": med, "rounds": times}, open(sys.argv[1], "w"), indent=1)
