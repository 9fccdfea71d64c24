"""GPU experiment of calls 1-2 (session 30): drafts of the narrow fp8 MLA tile (its FP8_QK
 and 8-warp forms, since dropped; kept as the record of what ran) against the table."""
import argparse, json, sys, time
from pathlib import Path
sys.path.insert(0, "tools"); sys.path.insert(0, ".")
import torch
import kdispatch
from bench_decode import Shape, make_sets, time_fns, read_ceiling, live_bytes
from kdispatch.kernels.decode_attention import reference_decode_attention
from kdispatch.kernels.decode_attention.launch import planned_launches
from kdispatch.kernels.decode_attention.spec import gluon_config
from kdispatch.kernels.decode_attention.gluon_mla_narrow import _narrow_stage1, narrow_args, narrow_constexprs
from kdispatch.launching import KernelLaunch


def narrow_launch_args(q, kv, bt, sl, scale, splits, po, pl, g, ks, vs, stages, fp8_qk):
    from kdispatch.kernels.decode_attention.checks import q_dims
    b, t, h, _ = q_dims(q)
    kw = narrow_constexprs(splits, g, 16 if t * h <= 16 else 32, kv.shape[1], t, ks is not None, stages)
    kw["FP8_QK"] = fp8_qk
    return (1, b, g), narrow_args(q, kv, bt, sl, scale, po, pl, ks, vs), kw


def narrow_fn(inp, splits, stages, fp8_qk, warps=8):
    ls = planned_launches(gluon_config(splits), inp["q"], inp["k_cache"], inp["v_cache"],
                          inp["block_table"], inp["seq_lens"], scale=inp["scale"],
                          k_scale=inp.get("k_scale"), v_scale=inp.get("v_scale"))
    st1, red = ls[0], ls[-1]
    po, pl = st1.args[6], st1.args[7]
    g = st1.constexprs["GRID_SPLITS"]
    grid, args, kw = narrow_launch_args(inp["q"], inp["k_cache"], inp["block_table"],
                                        inp["seq_lens"], inp["scale"], splits, po, pl, g,
                                        inp.get("k_scale"), inp.get("v_scale"), stages, fp8_qk)
    nl = KernelLaunch(_narrow_stage1, grid, args, kw, {"num_warps": warps})
    out = red.args[3]
    def f():
        nl.run(); red.run()
        return out
    return f


def table_fn(inp):
    out = torch.empty(inp["q"].shape[:-1] + (512,), device="cuda", dtype=torch.bfloat16)
    kw = {k: v for k, v in inp.items() if k in ("k_scale", "v_scale")}
    def f():
        return kdispatch.decode_attention(inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"],
                                          inp["seq_lens"], scale=inp["scale"], out=out, **kw)
    return f


def err(out, inp):
    ref = reference_decode_attention(inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"],
                                     inp["seq_lens"], scale=inp["scale"], k_scale=inp.get("k_scale"),
                                     v_scale=inp.get("v_scale"))
    return (out.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="narrow.json")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    res = {"ceiling": read_ceiling(132), "cases": [], "checks": []}
    # correctness: ragged lengths around page/tile boundaries
    for hq, ql, page in [(16, 1, 16), (12, 1, 16), (16, 1, 64), (16, 1, 32), (16, 2, 16), (8, 4, 16)]:
        s = Shape(f"chk-{hq}x{ql}-p{page}", 8, hq, 1, 576, 512, 4096, kv="fp8", q_len=ql, page=page)
        inp = make_sets(s, 1, 1)[0]
        inp["seq_lens"].copy_(torch.tensor([1, 15, 16, 17, 63, 64, 65, 4096][:8], dtype=torch.int32))
        combos = [(3, 3, True, 8), (3, 3, False, 8)]
        if hq == 16 and ql == 1 and page == 16:
            combos += [(1, 2, True, 8), (1, 2, False, 4), (3, 3, True, 4)]
        for splits, stages, fq, w in combos:
                    o = narrow_fn(inp, splits, stages, fq, w)()
                    torch.cuda.synchronize()
                    e, m = err(o, inp)
                    res["checks"].append(dict(case=s.name, splits=splits, stages=stages, fp8_qk=fq, warps=w, err=e, refmax=m))
                    print("check", s.name, splits, stages, fq, w, "err %.5f (ref max %.3f)" % (e, m), flush=True)
        o = table_fn(inp)(); torch.cuda.synchronize()
        e, m = err(o, inp)
        res["checks"].append(dict(case=s.name, table=True, err=e, refmax=m))
        print("check", s.name, "table err %.5f" % e, flush=True)
    cases = [("kimi-b8", 8, 12, 327600, 1, [(33, 3, 4), (33, 3, 8), (16, 3, 8)]),
             ("ds-b32", 32, 16, 16384, 1, [(4, 2, 4), (4, 2, 8), (4, 3, 8), (8, 3, 8)]),
             ("ds-b8", 8, 16, 16384, 1, [(16, 3, 8)]), ("kimi-b1", 1, 12, 65536, 1, [(132, 3, 8)]),
             ("ds-b32-rag", 32, 16, 16384, 1, [(4, 3, 8), (8, 3, 8)]),
             ("ds-b32-q2", 32, 16, 16384, 2, [(8, 3, 8), (4, 3, 8)])]
    if a.quick:
        cases = cases[:2]
    for name, b, hq, ctx, ql, splitl in cases:
        rag = name.endswith("rag")
        s8 = Shape(name, b, hq, 1, 576, 512, ctx, kv="fp8", q_len=ql, mean=ctx // 2 if rag else 0)
        s16 = Shape(name + "-bf16", b, hq, 1, 576, 512, ctx, q_len=ql, mean=ctx // 2 if rag else 0)
        sets8 = make_sets(s8, 2, 0)
        sets16 = make_sets(s16, 2, 0)
        fns = {"table-fp8": [table_fn(i) for i in sets8], "table-bf16": [table_fn(i) for i in sets16]}
        for sp, stages, w in splitl:
                for fq in (True, False):
                    fns[f"narrow-s{sp}-st{stages}-w{w}-{'qk8' if fq else 'qk16'}"] = [narrow_fn(i, sp, stages, fq, w) for i in sets8]
        for k, fl in fns.items():
            o = fl[0](); torch.cuda.synchronize()
            e, m = err(o, sets8[0] if "fp8" in k or "narrow" in k else sets16[0])
            print(name, k, "err %.5f" % e, flush=True)
        times = {k: [] for k in fns}
        for r in range(a.rounds):
            order = list(fns) if r % 2 == 0 else list(reversed(list(fns)))
            for k in order:
                times[k].append(time_fns(fns[k])[0])
        row = {"case": name, "gb_fp8": live_bytes(s8) / 1e9, "gb_bf16": live_bytes(s16) / 1e9,
               "us": {k: sorted(v)[len(v) // 2] for k, v in times.items()}, "rounds": times}
        t8 = row["us"]["table-fp8"]
        for k, v in sorted(row["us"].items(), key=lambda x: x[1]):
            gb = row["gb_bf16"] if k == "table-bf16" else row["gb_fp8"]
            print(f"  {name} {k:28s} {v:9.1f} us  {gb * 1e3 / v / res['ceiling']['gbs'] * 100:5.1f}% ceil  x{t8 / v:.3f} vs table-fp8", flush=True)
        res["cases"].append(row)
        Path(a.out).write_text(json.dumps(res, indent=1))
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
