"""GPU experiment, call 3: the narrow fp8 MLA tile (skewed: PV of tile i-1 under tile i's
scores and conversion) through the public op with its config, against the table."""
import argparse, json, sys
from pathlib import Path
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import torch
import kdispatch
from bench_decode import Shape, make_sets, time_fns, read_ceiling, live_bytes
from kdispatch.kernels.decode_attention import reference_decode_attention
from kdispatch.kernels.decode_attention.launch import checked_plan
from kdispatch.kernels.decode_attention.spec import narrow_config


import kdispatch.kernels.decode_attention.launch as L  # noqa: E402
import kdispatch.kernels.decode_attention.gluon_mla_narrow as N  # noqa: E402

_ORIG = N.narrow_constexprs


def e4m3(inp, cfg):
    """The narrow tile with its scores on e4m3 MMAs (F16_QK off), through the explicit-config
    launcher (the cached path would reuse the default's plan)."""
    out = torch.empty(inp["q"].shape[:-1] + (512,), device="cuda", dtype=torch.bfloat16)

    def g():
        L.narrow_constexprs = lambda *a: {**_ORIG(*a), "F16_QK": False}
        try:
            return L.launch_decode_attention(
                cfg, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"],
                inp["seq_lens"], scale=inp["scale"], out=out, k_scale=inp["k_scale"],
                v_scale=inp["v_scale"])
        finally:
            L.narrow_constexprs = _ORIG
    return g


def fn(inp, cfg=None):
    out = torch.empty(inp["q"].shape[:-1] + (512,), device="cuda", dtype=torch.bfloat16)
    kw = {k: v for k, v in inp.items() if k in ("k_scale", "v_scale")}
    if cfg is not None:
        kw["config"] = cfg
    return lambda: kdispatch.decode_attention(inp["q"], inp["k_cache"], inp["v_cache"],
                                              inp["block_table"], inp["seq_lens"],
                                              scale=inp["scale"], out=out, **kw)


def err(out, inp):
    ref = reference_decode_attention(inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"],
                                     inp["seq_lens"], scale=inp["scale"], k_scale=inp.get("k_scale"),
                                     v_scale=inp.get("v_scale"))
    return (out.float() - ref.float()).abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="narrow3.json")
    a = ap.parse_args()
    res = {"ceiling": read_ceiling(132), "cases": [], "checks": []}
    for hq, ql, page in [(16, 1, 16), (12, 1, 16), (16, 1, 64), (16, 1, 32), (8, 2, 16)]:
        s = Shape(f"chk-{hq}x{ql}-p{page}", 8, hq, 1, 576, 512, 4096, kv="fp8", q_len=ql, page=page)
        inp = make_sets(s, 1, 1)[0]
        inp["seq_lens"].copy_(torch.tensor([1, 15, 16, 17, 63, 64, 65, 4096], dtype=torch.int32))
        for splits in (1, 3, 8):
            cfg = narrow_config(splits, hq * ql)
            assert checked_plan(cfg, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"],
                                inp["seq_lens"], None, 0.0, inp["k_scale"]).narrow
            o = fn(inp, cfg)(); torch.cuda.synchronize()
            o2 = fn(inp, cfg)(); torch.cuda.synchronize()
            e = err(o, inp)
            res["checks"].append(dict(case=s.name, splits=splits, err=e, stable=bool(torch.equal(o, o2))))
            print("check", s.name, splits, "err %.5f stable %s" % (e, torch.equal(o, o2)), flush=True)
        e = err(fn(inp)(), inp)
        res["checks"].append(dict(case=s.name, table=True, err=e))
        print("check", s.name, "table err %.5f" % e, flush=True)
    cases = [("kimi-b8", 8, 12, 327600, [16, 33]), ("ds-b32", 32, 16, 16384, [4, 8]),
             ("ds-b8", 8, 16, 16384, [16, 33]), ("kimi-b1", 1, 12, 65536, [132, 66]),
             ("ds-b32-rag", 32, 16, 16384, [4, 8]), ("kimi-b8-rag", 8, 12, 327600, [16, 33])]
    for name, b, hq, ctx, splitl in cases:
        rag = name.endswith("rag")
        s8 = Shape(name, b, hq, 1, 576, 512, ctx, kv="fp8", mean=ctx // 2 if rag else 0)
        s16 = Shape(name + "-bf16", b, hq, 1, 576, 512, ctx, mean=ctx // 2 if rag else 0)
        sets8, sets16 = make_sets(s8, 2, 0), make_sets(s16, 2, 0)
        fns = {"table-fp8": [fn(i) for i in sets8], "table-bf16": [fn(i) for i in sets16]}
        for sp in splitl:
            fns[f"narrow-s{sp}"] = [fn(i, narrow_config(sp, hq)) for i in sets8]
            if "F16_QK" in _ORIG(1, 1, 16, 16, 1, False, 2):  # the e4m3 scores beside
                fns[f"narrow-e4m3-s{sp}"] = [e4m3(i, narrow_config(sp, hq)) for i in sets8]
        for k, fl in fns.items():
            o = fl[0](); torch.cuda.synchronize()
            print(name, k, "err %.5f" % err(o, sets8[0] if "bf16" not in k else sets16[0]), flush=True)
        times = {k: [] for k in fns}
        for r in range(2):
            for k in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
                times[k].append(time_fns(fns[k])[0])
        row = {"case": name, "gb_fp8": live_bytes(s8) / 1e9, "gb_bf16": live_bytes(s16) / 1e9,
               "us": {k: sorted(v)[len(v) // 2] for k, v in times.items()}, "rounds": times}
        t8 = row["us"]["table-fp8"]
        for k, v in sorted(row["us"].items(), key=lambda x: x[1]):
            gb = row["gb_bf16"] if k == "table-bf16" else row["gb_fp8"]
            print(f"  {name} {k:14s} {v:9.1f} us  {gb * 1e6 / v / res['ceiling']['gbs'] * 100:5.1f}% ceil  x{t8 / v:.3f} vs table-fp8", flush=True)
        res["cases"].append(row)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
