"""The ``decode_attention`` op: split-KV paged decode attention (serving face)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import torch

from kdispatch.buckets import half_pow2_bucket, pow2_bucket
from kdispatch.dtypes import CACHE_DTYPES, dtype_name
from kdispatch.kernels.decode_attention import spec
from kdispatch.kernels.decode_attention.checks import check_decode_inputs, q_dims
from kdispatch.kernels.decode_attention.gluon_mla import _gluon_mla_stage1
from kdispatch.kernels.decode_attention.kernels import _decode_reduce, _decode_stage1
from kdispatch.kernels.decode_attention.latent import _decode_stage1_latent
from kdispatch.kernels.decode_attention.launch import (
    checked_plan,
    launch_decode_attention,
    launches,
)
from kdispatch.kernels.decode_attention.tuning import DecodeTuning
from kdispatch.opdef import Op, OpKey
from kdispatch.tensor_guard import shape_guard

#: True while torch.compile traces (a constant there); ~20-30 ns in eager
_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


#: the tensor form's names: the key's inputs and the rest of a decode call's arguments
#: (accepted so that a call's own keyword arguments resolve; they do not change the key)
TENSOR_ARGS = frozenset({"q", "k_cache", "v_cache", "block_table", "seq_lens",
                         "sliding_window", "batch_invariant", "scale", "out", "logit_cap",
                         "k_scale", "v_scale"})


class DecodeOp(Op):
    """Split-KV paged decode attention, GQA/MHA and absorbed MLA
    (see :func:`kdispatch.decode_attention`)."""

    name = "decode_attention"
    key_model = spec.DecodeKey
    config_model = spec.DecodeConfig
    args_model = spec.DecodeArgs
    kernels = (_decode_stage1, _decode_stage1_latent, _gluon_mla_stage1, _decode_reduce)
    launch_code = (checked_plan, launches)
    table_dirs: tuple[str | Path, ...] = ()
    tuning = DecodeTuning()
    tensor_args = TENSOR_ARGS

    @staticmethod
    def memo_key(args: Mapping[str, Any]) -> Hashable:
        """What :meth:`key` reads of a tensor-form call, in six tensor-attribute reads
        (``kdispatch.resolve``'s memo hit is this and a comparison where the last entry's
        :meth:`memo_guard` fails: another signature, or the first repeat of one).

        q's shape (batch, q_len, heads, head dim), dtype and device (type and index); the
        cache dtype; v_cache's shape, whose first three dims are k_cache's in every call
        the key accepts (page size, kv heads; the last is the v head dim); the block-table
        shape (its width is the context). A call of exactly the five tensors (the serving
        call: five names, four read here and ``seq_lens`` looked up) needs nothing else;
        any other call adds its argument names (so a hit never serves a call whose names
        :meth:`key` would refuse), the window and batch_invariant. A hit does not re-check
        the inputs: only a miss runs :meth:`key`'s checks.
        """
        try:
            q = args["q"]
            if len(args) == 5 and "seq_lens" in args:
                return (q.dtype, args["k_cache"].dtype, q.shape, args["block_table"].shape,
                        args["v_cache"].shape, q.device)
            return (tuple(args), args.get("sliding_window"), args.get("batch_invariant"),
                    q.dtype, args["k_cache"].dtype, q.shape, args["block_table"].shape,
                    args["v_cache"].shape, q.device)
        except KeyError:
            if "q" not in args:
                return tuple(args.items())  # the plain form
        except AttributeError:
            pass
        return ("invalid", id(args))  # not tensors, or one missing: key() names it

    @staticmethod
    def memo_guard(args: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool] | None:
        """For the serving call (the five tensors): a check that a later call has the same
        five names and a q, k_cache, v_cache and block_table of the same Python type,
        device, dtype and shape, in one C++ check (:func:`~kdispatch.tensor_guard.
        shape_guard`), so that its :meth:`memo_key` is this call's (the check compares more:
        every tensor's dtype and shape, requires_grad). A cache given as both k_cache and
        v_cache (torch's check takes a tensor once) is checked once, and a later call must
        give one cache too. None for any other call, or where torch has no such check.
        Under torch.compile's tracing the guards fail and none is made (the C++ check cannot
        be traced; the memo key can)."""
        if len(args) != 5 or "seq_lens" not in args or _compiling():
            return None
        try:
            q, k, v, bt = args["q"], args["k_cache"], args["v_cache"], args["block_table"]
        except KeyError:
            return None
        if v is not k:
            check = shape_guard(q, k, v, bt)

            def guard(args: Mapping[str, Any]) -> bool:
                return (len(args) == 5 and "seq_lens" in args and not _compiling()
                        and check(args["q"], args["k_cache"], args["v_cache"],
                                  args["block_table"]))
        else:
            check = shape_guard(q, k, bt)

            def guard(args: Mapping[str, Any]) -> bool:
                return (len(args) == 5 and "seq_lens" in args and not _compiling()
                        and args["v_cache"] is args["k_cache"]
                        and check(args["q"], args["k_cache"], args["block_table"]))
        return guard if check is not None else None

    def device_of(self, args: Mapping[str, Any]) -> Any:
        q = args.get("q")
        if isinstance(q, torch.Tensor):
            return q.device
        return args.get("device")

    def key(self, device: Any, args: Mapping[str, Any]) -> spec.DecodeKey:
        window = args.get("sliding_window")
        invariant = bool(args.get("batch_invariant", False))
        q = args.get("q")
        if q is not None:
            check_decode_inputs(q, args.get("k_cache"), args.get("v_cache"),
                                args.get("block_table"), args.get("seq_lens"))
            k, v, bt = args["k_cache"], args["v_cache"], args["block_table"]
            b, q_len, hq, dk = q_dims(q)
            fields = dict(dtype=dtype_name(q.dtype, "q"),
                          kv_dtype=dtype_name(k.dtype, "k_cache", CACHE_DTYPES),
                          num_q_heads=hq, num_kv_heads=k.shape[2], head_dim=dk,
                          head_dim_v=v.shape[3], page_size=k.shape[1], batch=b,
                          context=bt.shape[1] * k.shape[1], q_len=q_len)
        else:
            args = self.plain_args(args)
            fields = dict(dtype=args["dtype"], kv_dtype=args["kv_dtype"] or args["dtype"],
                          num_q_heads=args["num_q_heads"], num_kv_heads=args["num_kv_heads"],
                          head_dim=args["head_dim"],
                          head_dim_v=args["head_dim_v"] or args["head_dim"],
                          page_size=args["page_size"], batch=args["batch"],
                          context=args["context"], q_len=args["q_len"])
        if window is not None:
            try:
                ok = not isinstance(window, bool) and int(window) >= 1
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"sliding_window: must be None or an int >= 1, got {window!r}")
            fields["context"] = min(fields["context"], int(window))
        fields["context"] = half_pow2_bucket(fields["context"], floor=16)
        fields["batch"] = 1 if invariant else pow2_bucket(fields["batch"])
        return spec.DecodeKey(**OpKey.device_fields(device), **fields,
                              sliding=window is not None, batch_invariant=invariant)

    def heuristic(self, key: Any) -> spec.DecodeConfig:
        return spec.heuristic(key)

    def is_valid(self, key: Any, config: Any) -> bool:
        return spec.is_valid(key, config)

    def launch(self, config: Any, **call_args: Any) -> Any:
        return launch_decode_attention(config, **call_args)


OP = DecodeOp()
