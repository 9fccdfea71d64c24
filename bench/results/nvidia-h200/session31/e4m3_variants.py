"""Session 31, call 4 (branch e4m3-scores): the narrow tile's e4m3 score forms against its
fp16 one. Call 2 gave each 128 columns (q's hi and lo parts together) an accumulator and
still had 6x the fp16 form's error at logits of ~160 log2 units. Here q's lo parts get one
accumulator of their own (LO_SEP), with hi in 128- or 256-column accumulators (HI_W).
(1) Per replay scale, max error against the fp32 reference beside the fp16 form and the
64-row tile; (2) graph-replay times, 2 alternating rounds, same run."""
import json, sys
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import torch
import kdispatch.kernels.decode_attention.gluon_mla_narrow as N
import kdispatch.kernels.decode_attention.launch as L
from bench_decode import Shape, make_sets, time_fns
from kdispatch.kernels._common import quantize_fp8
from kdispatch.kernels.decode_attention import reference_decode_attention
from kdispatch.kernels.decode_attention.spec import DecodeConfig, narrow_config

DK, DV = 576, 512
orig = N.narrow_constexprs
FORMS = {"f16": {}, "e4m3-chunk128": {"F16_QK": False},
         "e4m3-lo-hi128": {"F16_QK": False, "LO_SEP": True, "HI_W": 128},
         "e4m3-lo-hi256": {"F16_QK": False, "LO_SEP": True, "HI_W": 256}}


def call(cfg, form, q, k, bt, sl, ks, out=None):
    L.narrow_constexprs = lambda *a: {**orig(*a), **FORMS[form]}
    try:
        return L.launch_decode_attention(cfg, q, k, k[..., :DV], bt, sl, scale=DK ** -0.5,
                                         k_scale=ks, v_scale=ks, out=out)
    finally:
        L.narrow_constexprs = orig


res = {"precision": [], "times": []}
for hq, page in ((16, 16), (12, 64)):
    g = torch.Generator(device="cuda").manual_seed(hq + page)
    b, ctx = 8, 8192
    pages = ctx // page
    nb = b * pages + 5
    ks = torch.full((1,), 0.02, device="cuda")
    k = quantize_fp8(torch.randn(nb, page, 1, DK, device="cuda", generator=g), ks,
                     torch.float8_e4m3fn)
    bt = torch.randperm(nb, device="cuda", generator=g)[:b * pages].view(b, pages).int()
    ragged = [[1, 15, 16, 17, 63, 64, 65, ctx], [ctx - 1, 4097, 4096, 2, 3, 129, 1000, 128]]
    for i, (lens, s) in enumerate(zip(ragged * 2, (0.02, 0.05, 0.01, 0.5))):
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        ks.fill_(s)
        q = torch.randn(b, hq, DK, device="cuda", generator=g).to(torch.bfloat16)
        ref = reference_decode_attention(q, k, k[..., :DV], bt, sl, scale=DK ** -0.5,
                                         k_scale=ks, v_scale=ks).float()
        row = {"heads": hq, "page": page, "replay": i, "scale": s}
        for form in FORMS:
            out = call(narrow_config(2, hq), form, q, k, bt, sl, ks).float()
            torch.cuda.synchronize()
            row[form] = (out - ref).abs().max().item()
        g64 = DecodeConfig(kernel="gluon", num_kv_splits=2, block_n=64, block_h=64,
                           num_warps=8, num_stages=2)
        row["gluon64"] = (call(g64, "f16", q, k, bt, sl, ks).float() - ref).abs().max().item()
        print(row, flush=True)
        res["precision"].append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)

for name, b, hq, ctx, sp in (("ds-b32", 32, 16, 16384, 4), ("kimi-b8", 8, 12, 327600, 33)):
    sets = make_sets(Shape(name, b, hq, 1, DK, DV, ctx, kv="fp8"), 2, 0)
    fns = {}
    for form in FORMS:
        fl = []
        for inp in sets:
            out = torch.empty(inp["q"].shape[:-1] + (DV,), device="cuda", dtype=torch.bfloat16)
            fl.append(lambda inp=inp, out=out, form=form: call(
                narrow_config(sp, hq), form, inp["q"], inp["k_cache"], inp["block_table"],
                inp["seq_lens"], inp["k_scale"], out))
        fns[form] = fl
    times = {f: [] for f in fns}
    for r in range(2):
        for f in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
            times[f].append(time_fns(fns[f])[0])
    med = {f: min(v) for f, v in times.items()}
    print(name, {f: round(v, 1) for f, v in med.items()},
          {f: round(med["f16"] / v, 3) for f, v in med.items()}, flush=True)
    res["times"].append({"case": name, "splits": sp, "best_of_rounds_us": med, "rounds": times})
    json.dump(res, open(sys.argv[1], "w"), indent=1)
