"""Presets: the keys worth tuning, as models (shapes) that every op maps to its own keys.

A :class:`ModelShape` describes a model's attention as a serving engine runs it (heads,
head dims, the decode batch x context pairs, the token counts of its KV writes). Each op's
tuning face says which plain-form argument sets a model contributes
(:meth:`~kdispatch.opdef.OpTuning.preset_args`), so this module names no op and a new op
joins every preset by implementing that one method. Explicit :class:`Preset` lists (op +
arguments) serve tests and ops with their own shapes. Every model preset is bf16 with
16-token pages, per BENCHMARKING.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: candidates per key of the model presets (heuristic and baseline included; the ops order
#: their candidates most telling first). ``--max-candidates`` overrides it.
MODEL_CANDIDATES = 12


@dataclass(frozen=True)
class PresetEntry:
    """One op call shape: the op and the plain-form arguments of its key."""

    op: str
    args: Mapping[str, Any]
    optional: bool = False
    note: str = ""


@dataclass(frozen=True)
class ModelShape:
    """A model's attention shapes, as every op's ``preset_args`` reads them.

    Attributes
    ----------
    num_q_heads, num_kv_heads, head_dim : int
        Per GPU (after tensor parallelism). MLA: 1 kv head of head dim 576.
    head_dim_v : int, optional
        V head dim when it differs (MLA: 512).
    decode : tuple of (batch, context)
        Decode shapes (context = block-table capacity in tokens).
    write_tokens : tuple of int
        Tokens per KV-cache write (decode steps and prefill chunks).
    fp8_kv : bool
        Also tune an fp8 KV cache (bf16 activations) where the op supports one.
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int | None = None
    decode: tuple[tuple[int, int], ...] = ()
    write_tokens: tuple[int, ...] = ()
    page_size: int = 16
    dtype: str = "bfloat16"
    fp8_kv: bool = True


@dataclass(frozen=True)
class Preset:
    """A named set of keys: a model (expanded by every op) and/or explicit entries.

    ``max_candidates`` caps candidates per key (heuristic and baseline always kept).
    """

    name: str
    description: str
    entries: tuple[PresetEntry, ...] = ()
    max_candidates: int | None = None
    model: ModelShape | None = None
    ops: tuple[str, ...] | None = None  # only these ops (None: every op that maps the model)


def grid(batch: Iterable[int], context: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Every (batch, context) pair.

    >>> grid([1, 8], [4096])
    ((1, 4096), (8, 4096))
    """
    return tuple(itertools.product(batch, context))


_BUILTIN = (
    Preset("ouro-1.4b", "Ouro-1.4B (24 layers x 4 loops): MHA 16/16 x 128; KV writes of 1, 8, "
           "64 and 16,384 tokens; decode batch 1, 8 at 4k context",
           model=ModelShape(16, 16, 128, decode=grid([1, 8], [4096]),
                            write_tokens=(1, 8, 64, 16384)), max_candidates=MODEL_CANDIDATES),
    Preset("huginn", "Huginn-0125 (55 heads x 96, MHA, 32 recurrent loops): KV writes of 1, "
           "8, 64 tokens; decode batch 1, 8 at its 4k context",
           model=ModelShape(55, 55, 96, decode=grid([1, 8], [4096]), write_tokens=(1, 8, 64)),
           max_candidates=MODEL_CANDIDATES),
    Preset("llama3-8b", "Llama-3-8B: GQA 32/8 x 128, decode batch 1, 8, 64 x context 8k, 32k, "
           "131k and batch 4 x 262,144; KV writes of 8 heads x 128",
           model=ModelShape(32, 8, 128, decode=grid([1, 8, 64], [8192, 32768, 131072])
                            + ((4, 262144),), write_tokens=(1, 8, 64, 16384)),
           max_candidates=MODEL_CANDIDATES),
    Preset("llama3.2-1b", "Llama-3.2-1B: GQA 32/8 x 64 (head dim 64), decode batch 1, 8, 64 x "
           "context 8k, 32k and batch 4 x 262,144; KV writes of 8 heads x 64",
           model=ModelShape(32, 8, 64, decode=grid([1, 8, 64], [8192, 32768]) + ((4, 262144),),
                            write_tokens=(1, 8, 64)), max_candidates=MODEL_CANDIDATES),
    Preset("gemma2-9b", "Gemma-2-9B: GQA 16/8 x 256 (head dim 256), decode batch 1, 8, 64 x "
           "context 8k, 32k and batch 4 x 262,144; KV writes of 8 heads x 256",
           model=ModelShape(16, 8, 256, decode=grid([1, 8, 64], [8192, 32768]) + ((4, 262144),),
                            write_tokens=(1, 8, 64)), max_candidates=MODEL_CANDIDATES),
    Preset("kimi-k3-tp8", "Kimi-K3 at TP8: absorbed MLA, 12 q heads, 1 latent head 576/512, "
           "batch 1, 8 x context 65,536 and 327,600; latent-cache writes",
           model=ModelShape(12, 1, 576, 512, decode=grid([1, 8], [65536, 327600]),
                            write_tokens=(1, 8, 64)), max_candidates=MODEL_CANDIDATES),
    Preset("deepseek-v3-tp8", "DeepSeek-V3 at TP8: absorbed MLA, 16 q heads, 1 latent head "
           "576/512, batch 8, 32 x context 16,384 and 327,600; latent-cache writes",
           model=ModelShape(16, 1, 576, 512, decode=grid([8, 32], [16384, 327600]),
                            write_tokens=(1, 8, 64)), max_candidates=MODEL_CANDIDATES),
    Preset("deepseek-v3-dp", "DeepSeek-V3 with data-parallel attention (all 128 heads on one "
           "GPU): absorbed MLA, 1 latent head 576/512, 64-token pages, batch 32, 128 x "
           "context 8k-64k (ragged requests of mean 4k-32k); latent-cache writes",
           model=ModelShape(128, 1, 576, 512, page_size=64,
                            decode=grid([32, 128], [8192, 16384, 32768, 65536]),
                            write_tokens=(1, 8, 64)), max_candidates=MODEL_CANDIDATES),
    Preset("smoke", "Tiny shapes for the CPU interpreter: two KV-write keys and two small "
           "decode keys (GQA 4/2 x 64), a few candidates each",
           model=ModelShape(4, 2, 64, decode=((1, 64), (2, 32)), write_tokens=(1, 8),
                            fp8_kv=False),
           max_candidates=4),
)
PRESETS: dict[str, Preset] = {p.name: p for p in _BUILTIN}


def preset_names() -> list[str]:
    """Names of the known presets, sorted."""
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError naming the known presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset: unknown preset {name!r}; known: "
                         f"{', '.join(preset_names())}") from None


def register_preset(preset: Preset, *, replace: bool = False) -> Preset:
    """Add a preset (tests and user code); ValueError if the name is taken."""
    if preset.name in PRESETS and not replace:
        raise ValueError(f"preset: {preset.name!r} already exists")
    PRESETS[preset.name] = preset
    return preset


def unregister_preset(name: str) -> None:
    """Remove a preset added with :func:`register_preset` (no error if absent)."""
    PRESETS.pop(name, None)


def entries_of(preset: Preset, ops: Iterable[Any]) -> list[PresetEntry]:
    """The preset's entries for ``ops`` (Op objects): its explicit entries, then each op's
    expansion of the model (optional: an op may not support a model's shape)."""
    by_name = {op.name: op for op in ops}
    out = [e for e in preset.entries if e.op in by_name]
    if preset.model is not None:
        for op in by_name.values():
            if op.tuning is None or (preset.ops is not None and op.name not in preset.ops):
                continue
            for args in op.tuning.preset_args(preset.model):
                out.append(PresetEntry(op.name, args, optional=True,
                                       note=f"{preset.name}'s shape"))
    return out


def expand(names: Iterable[str], ops: Iterable[Any]) -> list[PresetEntry]:
    """The entries of the named presets for ``ops`` (Op objects), in order.

    >>> from kdispatch.registry import all_ops
    >>> len(expand(["smoke"], all_ops())) >= 4
    True
    """
    ops = list(ops)
    out: list[PresetEntry] = []
    for name in names:
        out.extend(entries_of(get_preset(name), ops))
    return out
