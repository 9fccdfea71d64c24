"""Keys, heuristics, candidates, presets and CLI options for fp8 caches and multi-token
decode (no kernels run)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from pydantic import ValidationError

from kdispatch.cli import main
from kdispatch.device import Device
from kdispatch.kernels.decode_attention import OP as DECODE
from kdispatch.kernels.decode_attention.spec import DecodeKey, latent_tile, workspace_bytes
from kdispatch.kernels.kv_write import OP as WRITE
from kdispatch.kernels.kv_write import KVWriteKey
from kdispatch.registry import all_ops
from kdispatch.tuning.presets import expand

H200 = Device.from_key("nvidia-h200")
DEEPSEEK = dict(batch=32, context=16384, num_q_heads=16, num_kv_heads=1, head_dim=576,
                head_dim_v=512, page_size=16, dtype="bfloat16")
FP8 = "float8_e4m3fn"


def dkey(device=None, **kw) -> DecodeKey:
    return DECODE.key(device or H200, {**DEEPSEEK, **kw})


def test_decode_key_reads_q_len_and_cache_dtype_from_tensors(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the checks on a GPU host
    q = torch.empty(3, 2, 8, 64, dtype=torch.bfloat16)
    k = torch.empty(10, 16, 2, 64, dtype=torch.float8_e4m3fn)
    args = dict(q=q, k_cache=k, v_cache=k, block_table=torch.empty(3, 4, dtype=torch.int32),
                seq_lens=torch.empty(3, dtype=torch.int32))
    key = DECODE.key(H200, args)
    assert (key.q_len, key.kv_dtype, key.dtype, key.num_q_heads, key.batch) == \
        (2, FP8, "bfloat16", 8, 4)
    one = DECODE.key(H200, {**args, "q": q[:, 0]})
    assert one.q_len == 1 and one.model_copy(update={"q_len": 2}) == key
    assert DECODE.memo_key(args) != DECODE.memo_key({**args, "q": q[:, 0]})
    bf16 = {**args, "k_cache": k.bfloat16(), "v_cache": k.bfloat16()}
    assert DECODE.key(H200, bf16).kv_dtype == "bfloat16"
    assert DECODE.memo_key(bf16) != DECODE.memo_key(args)


def test_decode_plain_form_and_validation():
    key = dkey(q_len=2, kv_dtype="fp8")  # the alias names the canonical dtype
    assert (key.q_len, key.kv_dtype) == (2, FP8)
    assert dkey().q_len == 1 and dkey().kv_dtype == "bfloat16"
    for bad in (dict(q_len=0), dict(q_len=9), dict(kv_dtype="int8")):
        with pytest.raises(ValueError, match="q_len|kv_dtype"):
            dkey(**bad)
    with pytest.raises(ValidationError, match="kv_dtype"):
        DecodeKey(**{**dkey().model_dump(), "dtype": "float16"})  # bf16 cache, fp16 q
    # a stored key from before q_len existed reads as one token
    old = {k: v for k, v in dkey().model_dump(mode="json").items() if k != "q_len"}
    assert DECODE.parse_key(old) == dkey()


def test_mla_two_tokens_share_one_block_and_the_grid():
    """DeepSeek TP8 with two tokens: 32 rows (2 tokens x 16 heads) in one block, so every
    latent tile is read once for both tokens; the grid (and split count) equals Q=1's.
    The Triton tiles are the session-8 full-space tune's bests (the A100's here): bf16 32
    rows at 32 tokens, 4 warps; fp8 latents take the bf16 16-row tile (no spills since the latent is staged as fp16)
    and wider blocks at 64 tokens, 8 warps: one per SM; 128 heads in 64-row blocks (the
    session-9 tune: 1.6x faster than 32-row fp8 blocks). On the H200 the bf16 two-token
    rows take the Gluon tile (64 rows, session 12; fp8 latents since session 20); the
    Triton tile is the A100's."""
    a100 = Device.from_key("nvidia-a100")
    one, two = DECODE.heuristic(dkey(a100)), DECODE.heuristic(dkey(a100, q_len=2))
    assert (one.block_h, two.block_h) == (16, 32)
    assert (two.block_n, two.num_warps, two.num_kv_splits) == (32, 4, one.num_kv_splits)
    assert DECODE.heuristic(dkey(q_len=2)).kernel == "gluon"
    for kw in (dict(q_len=2), dict(num_q_heads=128, q_len=2), dict(kv_dtype=FP8),
               dict(kv_dtype=FP8, q_len=2), dict(kv_dtype=FP8, num_q_heads=128)):
        assert DECODE.is_valid(dkey(**kw), DECODE.heuristic(dkey(**kw))), kw
    assert DECODE.heuristic(dkey(num_q_heads=128, q_len=2)).block_h == 64
    f1, f2 = DECODE.heuristic(dkey(kv_dtype=FP8)), DECODE.heuristic(dkey(kv_dtype=FP8, q_len=2))
    # the H200's 16-row fp8 latent: the narrow Gluon tile (session 31), 64 tokens a tile
    assert (f1.kernel, f1.block_h, f1.block_n, f1.num_warps) == ("gluon", 16, 64, 4)
    a1 = DECODE.heuristic(dkey(a100, kv_dtype=FP8))
    a2 = DECODE.heuristic(dkey(a100, kv_dtype=FP8, q_len=2))
    assert (a2.block_h, a2.block_n, a2.num_warps, a2.num_stages) == (32, 64, 8, 2)
    assert a2.num_kv_splits == max(1, a1.num_kv_splits // 2)  # one resident program per SM
    # on the H200 fp8 latents past 16 rows take the 64-row Gluon tile (session 20); the
    # A100's fp8 latents the Triton tiles
    assert f2.kernel == "gluon" and f2.block_h == 64
    assert a1.kernel == a2.kernel == "triton" and (a1.block_h, a1.block_n) == (16, 32)
    assert DECODE.heuristic(dkey(kv_dtype=FP8, num_q_heads=128)).block_h == 64
    k8 = dkey(q_len=8, num_q_heads=128, batch=512)
    assert workspace_bytes(k8, 2) == 8 * workspace_bytes(dkey(num_q_heads=128, batch=512), 2)


@pytest.mark.parametrize("kw", [dict(q_len=2), dict(kv_dtype=FP8), dict(q_len=2, kv_dtype=FP8),
                                dict(q_len=4, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                     head_dim_v=128, kv_dtype=FP8, batch=4, context=262144)])
def test_candidates_valid_and_bounded(kw):
    key = dkey(**kw)
    cands = list(DECODE.tuning.candidates(key))
    assert 8 <= len(cands) <= 60 and len(set(cands)) == len(cands)
    assert all(DECODE.is_valid(key, c) for c in cands)
    assert DECODE.heuristic(key) in cands and DECODE.tuning.baseline(key) in cands
    if key.q_len > 1:  # row blocks up to all the tokens x heads of a kv head
        assert max(c.block_h for c in cands) >= min(64, key.rows)


def test_fp8_bytes_and_shared_memory():
    bf16, fp8 = dkey(context=327600, batch=8), dkey(context=327600, batch=8, kv_dtype=FP8)
    assert DECODE.tuning.bytes_moved(fp8) < 0.51 * DECODE.tuning.bytes_moved(bf16)
    assert DECODE.tuning.bytes_moved(dkey(q_len=2)) > DECODE.tuning.bytes_moved(dkey())
    big = DECODE.heuristic(bf16).model_copy(update={"block_n": 64, "num_stages": 4})
    assert not DECODE.is_valid(bf16, big) and DECODE.is_valid(fp8, big)  # half the smem


def test_kv_write_key_cache_dtype():
    args = dict(device="nvidia-h200", tokens=1, num_kv_heads=16, head_dim=128)
    plain = WRITE.key(H200, {**args, "kv_dtype": "fp8"})
    assert plain.kv_dtype == FP8 and WRITE.key(H200, args).kv_dtype == "bfloat16"
    qkv = torch.empty(1, 3 * 16 * 128, dtype=torch.bfloat16, device="meta")
    tensors = {"key": qkv[:, :2048].view(1, 16, 128), "value": qkv[:, 2048:4096].view(1, 16, 128),
               "key_cache": torch.empty(4, 16, 16, 128, dtype=torch.float8_e4m3fn,
                                        device="meta"),
               "slot_mapping": torch.empty(1, dtype=torch.int64, device="meta")}
    tensors["value_cache"] = tensors["key_cache"]
    assert WRITE.key(H200, tensors) == plain
    bf16 = {**tensors, "key_cache": tensors["key_cache"].bfloat16()}
    assert WRITE.memo_key(bf16) != WRITE.memo_key(tensors)
    old = {k: v for k, v in WRITE.key(H200, args).model_dump(mode="json").items()
           if k != "kv_dtype"}  # a row stored before the field existed
    assert WRITE.parse_key(old).kv_dtype == "bfloat16"
    with pytest.raises(ValidationError, match="kv_dtype"):
        KVWriteKey(**{**plain.model_dump(), "dtype": "float16", "kv_dtype": "bfloat16"})
    assert WRITE.is_valid(plain, WRITE.heuristic(plain))
    assert WRITE.tuning.bytes_moved(plain) < WRITE.tuning.bytes_moved(WRITE.key(H200, args))


def test_presets_add_fp8_caches_and_mla_multi_token_keys():
    def keys(preset, op):
        return [e.args for e in expand([preset], all_ops()) if e.op == op]

    kimi = keys("kimi-k3-tp8", "decode_attention")
    combos = {(a["kv_dtype"], a["q_len"]) for a in kimi}
    assert combos == {("bfloat16", 1), (FP8, 1), ("bfloat16", 2), (FP8, 2)}
    assert len(kimi) == 4 * 4  # 4 (batch, context) pairs x 4 combinations
    llama = keys("llama3-8b", "decode_attention")
    assert {(a["kv_dtype"], a["q_len"]) for a in llama} == {("bfloat16", 1), (FP8, 1)}
    assert {a["kv_dtype"] for a in keys("llama3-8b", "kv_write")} == {"bfloat16", FP8}
    # the CPU CI's preset stays tiny: bf16 only, two keys per op
    smoke = expand(["smoke"], all_ops())
    assert len(smoke) == 4 and all(e.args["kv_dtype"] == "bfloat16" for e in smoke)
    for e in expand(["kimi-k3-tp8"], all_ops()):  # every entry makes a valid key
        op = DECODE if e.op == "decode_attention" else WRITE
        op.key(H200, {"device": "nvidia-h200", **e.args})


def test_cli_resolves_fp8_and_multi_token_keys():
    runner = CliRunner()
    res = runner.invoke(main, ["resolve", "decode_attention", "--device", "nvidia-h200",
                               "--batch", "32", "--context", "16384", "--num-q-heads", "16",
                               "--num-kv-heads", "1", "--head-dim", "576", "--head-dim-v",
                               "512", "--q-len", "2", "--kv-dtype", "float8_e4m3fn",
                               "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["key"]["q_len"] == 2 and out["key"]["kv_dtype"] == FP8
    assert out["config"]["block_h"] == 64 and out["config"]["kernel"] == "gluon"
    res = runner.invoke(main, ["resolve", "kv_write", "--device", "nvidia-h200", "--tokens",
                               "1", "--num-kv-heads", "16", "--head-dim", "128",
                               "--kv-dtype", "float8_e4m3fn", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["key"]["kv_dtype"] == FP8
    bad = runner.invoke(main, ["resolve", "decode_attention", "--device", "nvidia-h200",
                               "--batch", "1", "--context", "64", "--num-q-heads", "4",
                               "--num-kv-heads", "1", "--head-dim", "64", "--q-len", "9"])
    assert bad.exit_code != 0 and "q_len" in bad.output


def test_a_short_sweep_of_multi_token_mla_tries_the_smaller_row_block():
    """Two tokens x 12 heads (24 rows): within the first 8 candidates (the session tune's
    cap) the rows also run as two 16-row blocks at the heuristic's split count and the
    16-row latent tile, right after the heuristic's own merge variants (the Triton tiles:
    on the H200 the heuristic takes the Gluon tile here, on an A100 the 32-row one)."""
    key = dkey(Device.from_key("nvidia-a100"), num_q_heads=12, batch=8, context=327600,
               q_len=2)
    h = DECODE.heuristic(key)
    assert h.block_h == 32
    first = list(DECODE.tuning.candidates(key))[:8]
    small = [c for c in first if c.block_h == 16]
    assert small, first
    assert small[0].num_kv_splits == h.num_kv_splits
    assert (small[0].block_n, small[0].num_warps, small[0].num_stages) == latent_tile(key, 16)
    assert all(DECODE.is_valid(key, c) for c in first)
