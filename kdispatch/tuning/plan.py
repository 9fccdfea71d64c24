"""What to tune: the keys of presets or recorded misses, and each key's candidate list."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from kdispatch.device import Device
from kdispatch.errors import short_error
from kdispatch.opdef import Op, OpConfig
from kdispatch.registry import all_ops, get_op
from kdispatch.store import Store, digest
from kdispatch.tuning import presets as _presets
from kdispatch.tuning.devices import TuningError

Role = Literal["heuristic", "baseline", "candidate"]


@dataclass(frozen=True)
class TuneTarget:
    """One key to tune: the op name and the key as JSON data (picklable, for workers)."""

    op: str
    key: dict[str, Any]
    max_candidates: int | None = None


def tunable_ops(names: Iterable[str] | None = None) -> list[Op]:
    """The ops to tune: ``names`` (each must exist and have a tuning face) or every
    tunable op."""
    if not names:
        return [op for op in all_ops() if op.tuning is not None]
    out = []
    for name in names:
        try:
            op = get_op(name)
        except ValueError as exc:
            raise TuningError(str(exc)) from None
        if op.tuning is None:
            raise TuningError(f"op: {name!r} has no tuning face (define OpTuning or pass "
                              "inputs= to kdispatch.dispatch)")
        out.append(op)
    return out


def plan(device: Device, preset_names: Iterable[str], ops: Iterable[str] | None = None,
         max_candidates: int | None = None) -> tuple[list[TuneTarget], list[str]]:
    """The deduplicated keys of the named presets for ``device``.

    Returns
    -------
    targets : list of TuneTarget
    notes : list of str
        Entries skipped because the op rejected their shape (model shapes an op does not
        support, and optional explicit entries).
    """
    chosen = tunable_ops(ops)
    targets: list[TuneTarget] = []
    notes: list[str] = []
    seen: set[tuple[str, str]] = set()
    for pname in preset_names:
        preset = _presets.get_preset(pname)
        cap = max_candidates if max_candidates is not None else preset.max_candidates
        for entry in _presets.entries_of(preset, chosen):
            op = get_op(entry.op)
            try:
                key = op.key(device, op.plain_args(dict(entry.args)))
                op.heuristic(key)
            except (ValueError, ValidationError) as exc:
                msg = short_error(exc)
                if not entry.optional:
                    raise TuningError(f"preset {pname}: {entry.op} {dict(entry.args)}: "
                                      f"{msg}") from exc
                note = f"{pname}: skipped {entry.op} {dict(entry.args)}: {msg}"
                if note not in notes:
                    notes.append(note)
                continue
            data = key.model_dump(mode="json")
            k = (entry.op, digest(data))
            if k not in seen:
                seen.add(k)
                targets.append(TuneTarget(entry.op, data, cap))
    return targets, notes


def plan_defaults(device: Device, ops: Iterable[str], max_candidates: int | None = None,
                  ) -> tuple[list[TuneTarget], list[str]]:
    """The ops' own representative keys (``OpTuning.default_args``) for ``device``."""
    targets: list[TuneTarget] = []
    notes: list[str] = []
    for op in tunable_ops(ops):
        args_list = op.tuning.default_args() if op.tuning is not None else []
        if not args_list:
            notes.append(f"{op.name}: declares no default keys; name a --preset")
        for args in args_list:
            try:
                key = op.key(device, op.plain_args(dict(args)))
            except (ValueError, ValidationError) as exc:
                raise TuningError(f"{op.name} default key {dict(args)}: "
                                  f"{short_error(exc)}") from exc
            t = TuneTarget(op.name, key.model_dump(mode="json"), max_candidates)
            if t not in targets:
                targets.append(t)
    return targets, notes


def plan_misses(store: Store, device: Device, ops: Iterable[str] | None = None,
                max_candidates: int | None = None, max_input_bytes: int | None = None,
                ) -> tuple[list[TuneTarget], list[str]]:
    """The keys the store recorded as heuristic misses for ``device`` (not yet tuned).

    A key whose inputs would take more than ``max_input_bytes`` (its op's ``bytes_moved``)
    is refused with a note instead of allocated.
    """
    wanted = {op.name for op in tunable_ops(ops)}
    targets, notes = [], []
    for name, key in store.misses(device_key=device.key):
        if name not in wanted:
            continue
        op = get_op(name)
        try:
            parsed = op.parse_key(key)
        except (ValueError, ValidationError) as exc:
            notes.append(f"miss {name} {key}: not tunable here: {short_error(exc)}")
            continue
        need = op.tuning.bytes_moved(parsed) if op.tuning is not None else 0
        if max_input_bytes is not None and need > max_input_bytes:
            notes.append(f"miss {name} {key}: refused: its inputs need about "
                         f"{need / 2**30:,.1f} GiB, more than the {max_input_bytes / 2**30:,.1f}"
                         " GiB this device may allocate")
            continue
        targets.append(TuneTarget(name, parsed.model_dump(mode="json"), max_candidates))
    return targets, notes


def shard(targets: Sequence[TuneTarget], n: int) -> list[list[TuneTarget]]:
    """Split targets into ``n`` shards round-robin (keys of one op spread over workers).

    >>> [len(s) for s in shard([TuneTarget("x", {"i": i}) for i in range(5)], 2)]
    [3, 2]
    """
    if n < 1:
        raise ValueError(f"n: need at least one shard, got {n}")
    return [list(targets[i::n]) for i in range(n)]


def _digest(cfg: OpConfig) -> str:
    return digest(cfg.model_dump(mode="json"))


def candidate_list(op: Op, key: Any, cap: int | None = None,
                   ) -> list[tuple[OpConfig, Role]]:
    """Valid candidates of ``key`` as (config, role); heuristic first, baseline next.

    The role is ``"heuristic"``, ``"candidate"``, or ``"baseline"`` for the op's baseline
    when it is not itself a servable candidate of the space: it is timed for comparison only
    and is never stored as a best config (a baseline that mishandles what the op must
    handle, such as negative slots, may never be selected by a table). With ``cap``, the heuristic and baseline are
    kept, then the first half of the remaining room in the op's order (its closest
    variants of the heuristic), then the rest sampled evenly.
    """
    assert op.tuning is not None
    heur = op.heuristic(key)
    out: dict[str, tuple[OpConfig, Role]] = {_digest(heur): (heur, "heuristic")}
    rest: list[tuple[OpConfig, Role]] = []
    space: set[str] = set()
    for cfg in op.tuning.candidates(key):
        d = _digest(cfg)
        space.add(d)
        if d not in out and op.is_valid(key, cfg):
            out[d] = (cfg, "candidate")
            rest.append((cfg, "candidate"))
    chosen = [out[_digest(heur)]]
    base = op.tuning.baseline(key)
    if base is not None:
        d = _digest(base)
        if d not in out or out[d][1] == "candidate":
            servable = d in space and op.servable(key, base)
            role: Role = "candidate" if servable else "baseline"
            rest = [r for r in rest if _digest(r[0]) != d]
            chosen.append((base, role))
    if cap is not None and len(chosen) + len(rest) > cap:
        room = max(cap - len(chosen), 0)
        head = (room + 1) // 2
        tail = rest[head:]
        step = len(tail) / (room - head) if room > head else 0
        rest = rest[:head] + [tail[int(i * step)] for i in range(room - head)]
    return chosen + rest


def space_size(op: Op, key: Any) -> int:
    """How many configs the full search of ``key`` measures (heuristic and baseline too)."""
    return len(candidate_list(op, key))
