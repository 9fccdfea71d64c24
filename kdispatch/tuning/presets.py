"""Model shape presets: the op keys worth tuning for a model, as plain-form argument dicts.

A preset expands to :class:`PresetEntry` items, one per op call shape (``op`` plus the
plain-form arguments that ``spec.key(device, args)`` reads). Dynamic sizes are given as the
model's real sizes; the op's key buckets them, so several entries may share one key (the
sweep deduplicates). Every preset is bf16 with 16-token pages, per BENCHMARKING.md.

An entry marked ``optional`` is skipped, with a note, when the op rejects its shape (for
example a head dim the kernel does not support), instead of failing the whole preset.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DTYPE = "bfloat16"
PAGE = 16


@dataclass(frozen=True)
class PresetEntry:
    """One op call shape of a preset.

    Attributes
    ----------
    op : str
        Registered op name.
    args : Mapping
        Plain-form arguments of ``spec.key(device, args)``.
    optional : bool
        Skip (with ``note``) instead of failing when the op rejects the shape.
    note : str
        Why the entry is optional / what it stands for.
    """

    op: str
    args: Mapping[str, Any]
    optional: bool = False
    note: str = ""


#: candidates per key of the model presets (heuristic and baseline included; the ops order
#: their candidates most telling first). H200 session 3 measured 77 candidates in 1.6 minutes
#: with compiles, so the largest preset (llama3-8b, 14 keys) takes about 3.5 minutes and all
#: five about 9: one 10-minute device command. ``--max-candidates`` overrides it.
MODEL_CANDIDATES = 12


@dataclass(frozen=True)
class Preset:
    """A named set of shapes.

    Attributes
    ----------
    name, description : str
    entries : tuple of PresetEntry
    max_candidates : int, optional
        Cap on candidates per key (heuristic and baseline always kept): the CPU ``smoke``
        preset uses it so the interpreter finishes quickly.
    """

    name: str
    description: str
    entries: tuple[PresetEntry, ...]
    max_candidates: int | None = None


def grid(op: str, base: Mapping[str, Any], *, optional: bool = False, note: str = "",
         **axes: Iterable[Any]) -> list[PresetEntry]:
    """Entries for every combination of ``axes`` on top of ``base``.

    >>> [e.args["tokens"] for e in grid("kv_write", {"head_dim": 128}, tokens=[1, 8])]
    [1, 8]
    """
    names = list(axes)
    out = []
    for values in itertools.product(*(list(axes[n]) for n in names)):
        out.append(PresetEntry(op, {**base, **dict(zip(names, values))}, optional, note))
    return out


def _kv(heads: int, dim: int, tokens: Iterable[int], **kw: Any) -> list[PresetEntry]:
    base = {"num_kv_heads": heads, "head_dim": dim, "page_size": PAGE, "dtype": DTYPE}
    return grid("kv_write", base, tokens=tokens, **kw)


def _decode(hq: int, hk: int, dk: int, dv: int, batch: Iterable[int], context: Iterable[int],
            **kw: Any) -> list[PresetEntry]:
    base = {"num_q_heads": hq, "num_kv_heads": hk, "head_dim": dk, "head_dim_v": dv,
            "page_size": PAGE, "dtype": DTYPE}
    return grid("decode_attention", base, batch=batch, context=context, **kw)


_HUGINN_DECODE_NOTE = ("huginn decode has head dim 96; the decode op may not support it "
                       "(then it is skipped)")
_LATENT_NOTE = "MLA latent cache write (1 head x 576); skipped if kv_write rejects head dim 576"

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "ouro-1.4b",
        "Ouro-1.4B (24 layers x 4 loops): MHA 16/16 x 128; KV writes of 1, 8, 64 and 16,384 "
        "tokens; decode batch 1, 8 at 4k context",
        (*_kv(16, 128, [1, 8, 64, 16384]),
         *_decode(16, 16, 128, 128, [1, 8], [4096])),
        max_candidates=MODEL_CANDIDATES),
    Preset(
        "huginn",
        "Huginn-0125 (hidden 5280, 55 heads x 96, MHA, 32 recurrent loops): KV writes of 1, 8, "
        "64 tokens; decode batch 1, 8 at its 4k context if the decode op supports head dim 96",
        (*_kv(55, 96, [1, 8, 64]),
         *_decode(55, 55, 96, 96, [1, 8], [4096], optional=True, note=_HUGINN_DECODE_NOTE)),
        max_candidates=MODEL_CANDIDATES),
    Preset(
        "llama3-8b",
        "Llama-3-8B: GQA 32/8 x 128, decode batch 1, 8, 64 x context 8k, 32k, 131k and "
        "batch 4 x 262,144; KV writes of 8 heads x 128",
        (*_decode(32, 8, 128, 128, [1, 8, 64], [8192, 32768, 131072]),
         *_decode(32, 8, 128, 128, [4], [262144]),
         *_kv(8, 128, [1, 8, 64, 16384])),
        max_candidates=MODEL_CANDIDATES),
    Preset(
        "kimi-k3-tp8",
        "Kimi-K3 at TP8: absorbed MLA, 12 q heads, 1 latent head 576/512, batch 1, 8 x "
        "context 65,536 and 327,600",
        (*_decode(12, 1, 576, 512, [1, 8], [65536, 327600]),
         *_kv(1, 576, [1, 8, 64], optional=True, note=_LATENT_NOTE)),
        max_candidates=MODEL_CANDIDATES),
    Preset(
        "deepseek-v3-tp8",
        "DeepSeek-V3 at TP8: absorbed MLA, 16 q heads, 1 latent head 576/512, batch 8, 32 x "
        "context 16,384 and 327,600; latent-cache KV writes if supported",
        (*_decode(16, 1, 576, 512, [8, 32], [16384, 327600]),
         *_kv(1, 576, [1, 8, 64], optional=True, note=_LATENT_NOTE)),
        max_candidates=MODEL_CANDIDATES),
    Preset(
        "smoke",
        "Tiny shapes for the CPU interpreter: two KV-write keys and two small decode keys "
        "(GQA and MHA), a few candidates each",
        (*_kv(2, 32, [1, 8]),
         *_decode(4, 2, 64, 64, [1], [64]),
         *_decode(2, 2, 64, 64, [2], [32])),
        max_candidates=4),
)}


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


def expand(names: Iterable[str], ops: Iterable[str] | None = None) -> list[PresetEntry]:
    """The entries of the named presets, optionally only those of ``ops``, in order.

    >>> {e.op for e in expand(["ouro-1.4b"], ops=["kv_write"])}
    {'kv_write'}
    """
    wanted = set(ops) if ops else None
    out = []
    for name in names:
        for entry in get_preset(name).entries:
            if wanted is None or entry.op in wanted:
                out.append(entry)
    return out

