"""The ``kdispatch`` command line: tune, resolve, explain, show, export, import, merge, doctor.

Every command is a thin layer over library calls; domain errors (bad shapes, unknown ops or
devices, unusable databases or tables) become :class:`click.ClickException` messages.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdispatch._version import __version__
from kdispatch.errors import StoreError

DEVICE_KEY_FIELDS = ("device", "vendor", "arch", "cu_count")


def _console() -> Console:
    # Bound per call: CliRunner swaps sys.stdout, and a pipe should not get 80 columns.
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "140"))
    return Console(file=sys.stdout, width=width, soft_wrap=False)


@contextmanager
def _domain_errors() -> Iterator[None]:
    from kdispatch.tuning.sweep import TuningError

    try:
        yield
    except (ValueError, ValidationError, StoreError, TuningError, OSError) as exc:
        text = str(exc).strip().splitlines()
        raise click.ClickException(text[0] if text else type(exc).__name__) from exc


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _store(db: str | None, create: bool = True) -> Any:
    from kdispatch.store import Store

    return Store(db, create=create)


def _shape_fields(key: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in key.items() if k not in DEVICE_KEY_FIELDS}


def _compact(data: dict[str, Any] | None) -> str:
    if not data:
        return "-"
    return " ".join(f"{k}={v}" for k, v in data.items())


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="kdispatch")
def main() -> None:
    """kdispatch: tuned launch configs for Triton decode kernels.

    \b
    Example:
      kdispatch tune --device cpu --preset smoke
      kdispatch resolve decode_attention --device nvidia-h200 --batch 8 --context 327600 \\
          --num-q-heads 12 --num-kv-heads 1 --head-dim 576 --head-dim-v 512
    """


# -- tune ------------------------------------------------------------------------------------
@main.command()
@click.option("--device", default="auto", show_default=True,
              help="cuda:N, auto (the current GPU) or cpu (the Triton interpreter); all (every "
                   "GPU of this host) or a list (cuda:0,cuda:1 or cpu,cpu) runs one worker "
                   "process per device. With --ray: auto (the cluster's GPUs) or cpu.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None,
              metavar="[ADDRESS]",
              help="Run the shards as Ray tasks, one GPU each, on the cluster at ADDRESS "
                   "(auto, ray://head:10001) or on a local one when ADDRESS is left out. "
                   "Needs pip install \"kdispatch[ray]\" and kdispatch on every node; a "
                   "cluster needs a shared database: --db postgresql+psycopg://...")
@click.option("--shards", type=int, default=None,
              help="With --ray: number of tasks [default: the cluster's GPUs, 2 for cpu].")
@click.option("--max-retries", type=int, default=3, show_default=True,
              help="With --ray: retries of a task whose worker died (a retry resumes).")
@click.option("--preset", "presets", default=None,
              help="Comma-separated model presets (see --list-presets).")
@click.option("--op", "ops", default=None, help="Comma-separated ops to tune (default: all).")
@click.option("--db", default=None, help="Database URL or SQLite path (default: KDISPATCH_DB).")
@click.option("--budget-minutes", type=float, default=None,
              help="Stop cleanly once this many minutes have passed.")
@click.option("--from-misses", is_flag=True,
              help="Tune exactly the keys serving processes recorded as misses.")
@click.option("--max-candidates", type=int, default=None,
              help="Cap candidates per key (heuristic and baseline always kept).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option("--list-presets", is_flag=True, help="List the presets and exit.")
def tune(device: str, ray_address: str | None, shards: int | None, max_retries: int,
         presets: str | None, ops: str | None, db: str | None, budget_minutes: float | None,
         from_misses: bool, max_candidates: int | None, seed: int, list_presets: bool) -> None:
    """Measure every candidate config of the chosen keys into the database.

    Each candidate is checked against the fp32 reference first (wrong ones are recorded as
    rejected, compile/resource failures as infeasible), then timed. Every measurement is
    committed at once; a rerun resumes where a killed run stopped. Several devices (or Ray
    tasks) split the keys between them and write to one database; identical devices fill
    one table.

    \b
    Examples:
      kdispatch tune --device cpu --preset smoke
      kdispatch tune --device cuda:0 --preset llama3-8b,kimi-k3-tp8 --budget-minutes 9
      kdispatch tune --device auto --from-misses
      kdispatch tune --device all --preset llama3-8b
      kdispatch tune --device cuda:0,cuda:1 --preset llama3-8b
      kdispatch tune --device cpu,cpu --preset smoke
      kdispatch tune --ray --device cpu --preset smoke
      kdispatch tune --ray auto --preset llama3-8b --db postgresql+psycopg://kd@dbhost/kd
    """
    from kdispatch.tuning import presets as presets_mod

    if list_presets:
        for name in presets_mod.preset_names():
            click.echo(f"{name}: {presets_mod.get_preset(name).description}")
        return
    names, op_list = _split(presets), _split(ops)
    if not names and not from_misses:
        raise click.UsageError("choose --preset NAME[,NAME] or --from-misses "
                               f"(presets: {', '.join(presets_mod.preset_names())})")
    if budget_minutes is not None and budget_minutes <= 0:
        raise click.BadParameter("must be > 0", param_hint="--budget-minutes")
    if shards is not None and (ray_address is None or shards < 1):
        raise click.BadParameter("needs --ray and a value >= 1", param_hint="--shards")
    plan = {"presets": names, "ops": op_list or None, "from_misses": from_misses,
            "max_candidates": max_candidates}
    run = {"budget_minutes": budget_minutes, "seed": seed, "mark_misses": from_misses}
    with _domain_errors():
        from kdispatch.tuning import parallel, sweep

        ui = _Reporter(_console())
        if ray_address is not None:
            from kdispatch.tuning import ray_runner

            runs, results = ray_runner.tune_cluster(device, ray_address or None, shards,
                                                    max_retries, _store(db), plan, run, ui)
            return ui.finish(runs, results, budget_minutes)
        if parallel.is_multi_device(device):
            runs, results = parallel.tune_devices(device, _store(db), plan, run, ui)
            return ui.finish(runs, results, budget_minutes)
        dev, tdev = sweep.resolve_device(device)
        store = _store(db)
        targets, notes = parallel.plan_targets(store, dev, **plan)
        if not ui.announce(dev, targets, notes, store, from_misses):
            return
        with ui.bar() as (bar, task):
            result = sweep.tune(targets, device=dev, torch_device=tdev, store=store,
                                progress=_progress_cb(bar, task), **run)
        ui.console.print(_summary_table(result.summaries))
        ui.report(result.measured, result.skipped, f"run {result.run_id}",
                  result.stopped == "budget", budget_minutes)


class _Reporter:
    """What the tuner shows while it plans and runs: notes, the plan, one progress bar."""

    def __init__(self, console: Console):
        self.console = console

    def announce(self, dev: Any, targets: list[Any], notes: list[str], store: Any,
                 from_misses: bool, where: str = "") -> bool:
        for note in notes:
            self.console.print(f"[yellow]note:[/] {note}", highlight=False)
        if not targets:
            self.console.print("nothing to tune" + (" (no untuned misses recorded for "
                                                    f"{dev.key})" if from_misses else ""))
            return False
        self.console.print(f"tuning {len(targets)} keys on {dev.key} ({dev.name}, "
                           f"{dev.cu_count} CUs{where}) into {store.url}", highlight=False)
        return True

    @contextmanager
    def bar(self) -> Iterator[tuple[Progress, Any]]:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                      console=self.console, transient=False) as bar:
            yield bar, bar.add_task("tuning", total=None, eta="?")

    @contextmanager
    def progress(self) -> Iterator[Callable[[int, int | None, str], None]]:
        """``on_update(done, total, description)`` for several workers together."""
        t0 = time.monotonic()
        with self.bar() as (bar, task):
            def update(done: int, total: int | None, desc: str) -> None:
                elapsed = time.monotonic() - t0
                eta = f"{elapsed / done * (total - done):,.0f}s" if total and done else "?"
                bar.update(task, total=total, completed=done, eta=eta, description=desc)
            yield update

    def report(self, measured: int, skipped: int, run: str, budget_hit: bool,
               budget_minutes: float | None) -> None:
        self.console.print(f"measured {measured} candidates, {skipped} already in the "
                           f"database ({run})", highlight=False)
        if budget_hit:
            self.console.print(f"[yellow]stopped: the {budget_minutes:g}-minute budget is "
                               "spent; rerun to resume[/]")

    def finish(self, runs: list[Any], results: list[Any], budget_minutes: float | None) -> None:
        """Print each device's summary table, the totals, then fail naming failed workers."""
        from kdispatch.tuning import parallel

        for run in runs:
            if len(runs) > 1:
                self.console.print(f"{run.group.device.key}: {', '.join(run.group.names)}",
                                   highlight=False)
            self.console.print(_summary_table(run.summaries))
        measured, skipped, budget_hit = parallel.totals(results)
        self.report(measured, skipped, f"{len(results)} workers", budget_hit, budget_minutes)
        failed = parallel.failure_message(results)
        if failed:
            raise click.ClickException(failed)


def _progress_cb(bar: Progress, task: Any) -> Callable[[Any], None]:
    def cb(p: Any) -> None:
        shape = _compact(_shape_fields(p.key))
        eta = "?" if p.eta_s is None else f"{p.eta_s:,.0f}s"
        bar.update(task, total=p.total, completed=p.done, eta=eta,
                   description=f"[{p.key_index + 1}/{p.key_count}] {p.op} {shape}"[:90])
    return cb


def _summary_table(summaries: list[Any]) -> Table:
    table = Table(title="tuning summary")
    for col in ("op", "key", "best config", "best us", "heuristic us", "speedup", "ok/rej/inf"):
        table.add_column(col, overflow="fold")
    for s in summaries:
        sp = s.speedup
        table.add_row(s.op, _compact(_shape_fields(s.key)), _compact(s.best_config),
                      _us(s.best_us), _us(s.heuristic_us), "-" if sp is None else f"{sp:.2f}x",
                      f"{s.ok}/{s.rejected}/{s.infeasible}")
    return table


# -- resolve / explain -----------------------------------------------------------------------
_SHAPE_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--batch", {"type": int, "help": "Decode batch size."}),
    ("--context", {"type": int, "help": "Context capacity (tokens) per request."}),
    ("--num-q-heads", {"type": int, "help": "Query heads."}),
    ("--num-kv-heads", {"type": int, "help": "KV heads (1 for MLA)."}),
    ("--head-dim", {"type": int, "help": "Q/K head dim (576 for MLA)."}),
    ("--head-dim-v", {"type": int, "help": "V head dim (512 for MLA)."}),
    ("--page-size", {"type": int, "help": "KV page size [default: 16]."}),
    ("--dtype", {"type": str, "help": "float32, float16 or bfloat16 [default: bfloat16]."}),
    ("--tokens", {"type": int, "help": "Tokens written (kv_write)."}),
    ("--masking", {"type": click.Choice(["none", "row_mask", "active_rows", "both"]),
                   "help": "kv_write masking form."}),
    ("--sliding-window", {"type": int, "help": "Sliding window (tokens)."}),
    ("--batch-invariant", {"is_flag": True, "default": None,
                           "help": "Batch-invariant split count."}),
]


def _shape_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for name, kw in reversed(_SHAPE_OPTIONS):
        f = click.option(name, default=kw.pop("default", None), **kw)(f)
    return f


def _plain_args(op: str, device: str | None, shape: dict[str, Any]) -> dict[str, Any]:
    from kdispatch.device import Device

    args = {k: v for k, v in shape.items() if v is not None}
    args.setdefault("page_size", 16)
    args.setdefault("dtype", "bfloat16")
    args["device"] = device or Device.current().key
    return args


def _explain(op: str, device: str | None, db: str | None, shape: dict[str, Any]) -> Any:
    from kdispatch import api
    from kdispatch.dispatcher import reset
    from kdispatch.registry import get_op
    from kdispatch.settings import Settings, db_url

    settings = Settings.from_env()
    if db:
        settings = dataclasses.replace(settings, db_url=db_url(db), db_explicit=True)
    reset(settings)
    get_op(op)
    return api.explain(op, **_plain_args(op, device, shape))


def _explanation_json(e: Any) -> dict[str, Any]:
    return {"op": e.op, "key": e.key.model_dump(mode="json"),
            "config": e.config.model_dump(mode="json"), "provenance": e.provenance,
            "origin": e.origin,
            "consulted": [{"source": c.source, "outcome": c.outcome} for c in e.consulted]}


_RESOLVE_EXAMPLE = """
    \b
    Examples:
      kdispatch {cmd} decode_attention --device nvidia-h200 --batch 8 --context 327600 \\
          --num-q-heads 12 --num-kv-heads 1 --head-dim 576 --head-dim-v 512
      kdispatch {cmd} kv_write --device cpu-interpreter --tokens 8 --num-kv-heads 16 \\
          --head-dim 128 --json
"""


def _lookup_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """OP, the shape options, --device, --db and --json of ``resolve`` and ``explain``."""
    for deco in reversed((
        click.argument("op"),
        _shape_options,
        click.option("--device", default=None, help="Device key (nvidia-h200, "
                     "cpu-interpreter, ...); default: this machine's."),
        click.option("--db", default=None,
                     help="Database URL or SQLite path (default: KDISPATCH_DB)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON."),
    )):
        f = deco(f)
    return f


@main.command(help="Print the launch config an op gets at these shapes, and its provenance "
                   "(database, table, heuristic or override).\n" +
                   _RESOLVE_EXAMPLE.format(cmd="resolve"))
@_lookup_options
def resolve(op: str, device: str | None, db: str | None, as_json: bool, **shape: Any) -> None:
    with _domain_errors():
        e = _explain(op, device, db, shape)
    if as_json:
        data = _explanation_json(e)
        click.echo(json.dumps({k: data[k] for k in ("op", "key", "config", "provenance")},
                              indent=1))
        return
    click.echo(f"config: {json.dumps(e.config.model_dump(mode='json'), sort_keys=True)}")
    click.echo(f"provenance: {e.provenance}")


@main.command(help="Show the key an op call maps to, every source consulted and why the "
                   "config won.\n" + _RESOLVE_EXAMPLE.format(cmd="explain"))
@_lookup_options
def explain(op: str, device: str | None, db: str | None, as_json: bool, **shape: Any) -> None:
    with _domain_errors():
        e = _explain(op, device, db, shape)
    if as_json:
        click.echo(json.dumps(_explanation_json(e), indent=1))
        return
    click.echo(f"op: {e.op}")
    click.echo(f"key: {json.dumps(e.key.model_dump(mode='json'), sort_keys=True)}")
    click.echo("consulted:")
    for c in e.consulted:
        click.echo(f"  {c.source}: {c.outcome}")
    click.echo(f"config: {json.dumps(e.config.model_dump(mode='json'), sort_keys=True)}")
    click.echo(f"provenance: {e.provenance}" + ("" if e.origin == e.provenance
                                                  else f" (from {e.origin})"))


# -- show / export / import / merge ------------------------------------------------------------
@main.command()
@click.option("--device", default=None, help="Device key (default: every device).")
@click.option("--op", default=None, help="Only this op.")
@click.option("--db", default=None, help="Database URL or SQLite path (default: KDISPATCH_DB).")
def show(device: str | None, op: str | None, db: str | None) -> None:
    """List the tuned entries (fastest verified config per key) as a table.

    \b
    Examples:
      kdispatch show
      kdispatch show --device nvidia-h200 --op decode_attention
    """
    from kdispatch.registry import get_op
    from kdispatch.tables import heuristic_time

    with _domain_errors():
        store = _store(db, create=False)
        rows = store.best(device_key=device, op=op)
        times = store.config_times(device)
    table = Table(title=f"tuned entries in {store.url}")
    for col in ("op", "device", "key", "config", "best us", "heuristic us", "state"):
        table.add_column(col, overflow="fold")
    for r in rows:
        try:
            state = "current" if r.source_hash == get_op(r.op).source_hash() else "stale"
        except ValueError:
            state = "unknown op"
        table.add_row(r.op, r.device_key, _compact(_shape_fields(r.key)), _compact(r.config),
                      _us(r.median_us), _us(heuristic_time(times, r)), state)
    console = _console()
    console.print(table)
    console.print(f"{len(rows)} entries", highlight=False)


def _device_record(store: Any, key: str) -> Any:
    """The device as the tuner recorded it (its runs), else the built-in record."""
    from kdispatch.device import Device

    for run in reversed(store.runs()):
        if run.device_key == key:
            return Device(key=run.device_key, vendor=run.vendor, name=run.device_name,
                          arch=run.arch, cu_count=run.cu_count)
    return Device.from_key(key)


@main.command()
@click.option("--device", required=True, help="Device key to export (e.g. nvidia-h200).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Table file to write.")
@click.option("--op", default=None, help="Comma-separated ops (default: all).")
@click.option("--db", default=None, help="Database URL or SQLite path (default: KDISPATCH_DB).")
def export(device: str, output: str, op: str | None, db: str | None) -> None:
    """Write the best verified config per key of one device as a shipped-table JSON file.

    \b
    Example:
      kdispatch export --device nvidia-h200 -o db/nvidia-h200.json
    """
    from kdispatch.tables import export_table, write_table

    with _domain_errors():
        store = _store(db, create=False)
        table = export_table(store, _device_record(store, device), None, _split(op) or None)
        if not table.entries:
            raise click.ClickException(f"no verified rows for device {device!r} with the "
                                       f"installed kernels in {store.url}; nothing exported")
        write_table(table, output)
    click.echo(f"exported {len(table.entries)} entries for {device} to {output}")


@main.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--db", default=None, help="Database URL or SQLite path (default: KDISPATCH_DB).")
def import_(file: str, db: str | None) -> None:
    """Insert a table file's valid entries into the database as verified rows.

    \b
    Example:
      kdispatch import db/nvidia-h200.json --db ~/.cache/kdispatch/kdispatch.sqlite
    """
    from kdispatch.tables import import_table

    with _domain_errors():
        store = _store(db)
        inserted, rejected = import_table(file, store)
    for msg in rejected:
        click.echo(f"rejected: {msg}", err=True)
    click.echo(f"imported {inserted} entries from {file} ({len(rejected)} rejected)")


@main.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Merged table file to write.")
def merge(a: str, b: str, output: str) -> None:
    """Merge two tables of one device: the fastest verified entry per key wins.

    Keys where the two tables chose different configs are reported as conflicts.

    \b
    Example:
      kdispatch merge host1/nvidia-h200.json host2/nvidia-h200.json -o nvidia-h200.json
    """
    from kdispatch.tables import merge_tables, read_table, write_table

    with _domain_errors():
        table, conflicts = merge_tables(read_table(a), read_table(b))
        write_table(table, output)
    for c in conflicts:
        click.echo(f"conflict: {c.op} {_compact(_shape_fields(dict(c.key)))}: kept "
                   f"{_compact(dict(c.kept))} ({_us(c.kept_us)} us), dropped "
                   f"{_compact(dict(c.dropped))} ({_us(c.dropped_us)} us)")
    click.echo(f"merged {len(table.entries)} entries into {output} "
               f"({len(conflicts)} conflicts)")


# -- doctor ------------------------------------------------------------------------------------
@main.command()
@click.option("--db", default=None, help="Database URL or SQLite path (default: KDISPATCH_DB).")
def doctor(db: str | None) -> None:
    """Report the device, versions, database, shipped tables and recorded misses.

    \b
    Example:
      kdispatch doctor
    """
    from kdispatch.device import Device
    from kdispatch.settings import db_url
    from kdispatch.store import sqlite_path, toolchain_versions

    say = click.echo
    try:
        dev = Device.current()
        say(f"device: {dev.name} key={dev.key} vendor={dev.vendor} arch={dev.arch} "
            f"cu_count={dev.cu_count}")
    except Exception as exc:  # noqa: BLE001 - doctor reports, never crashes
        dev = None
        say(f"device: not detected ({type(exc).__name__}: {exc})")
    versions = toolchain_versions()
    say(f"versions: kdispatch {versions['kdispatch']}, torch {versions['torch']}, triton "
        f"{versions['triton']}, python {platform.python_version()}")
    say(f"triton interpreter: {'on' if os.environ.get('TRITON_INTERPRET') == '1' else 'off'}")
    from kdispatch.integrations.vllm import entry_point_status
    say(f"vllm plugin: {entry_point_status()}")
    url = db_url(db)
    path = sqlite_path(url)
    say(f"database: {url}")
    if path is not None and not path.exists():
        say("  (no database file yet: run `kdispatch tune` or `kdispatch import`)")
    else:
        try:
            store = _store(db, create=False)
            counts = store.counts()
            say("  rows: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
            misses = store.misses(include_tuned=True)
            pending = store.misses()
            by: dict[str, int] = {}
            for op, key in pending:
                name = f"{op}@{key.get('device')}"
                by[name] = by.get(name, 0) + 1
            say(f"misses: {len(misses)} recorded, {len(pending)} not yet tuned"
                + (" (" + ", ".join(f"{k}: {v}" for k, v in sorted(by.items())) + ")"
                   if by else ""))
            store.dispose()
        except Exception as exc:  # noqa: BLE001
            say(f"  unusable: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    say("tables:")
    for line in _table_report(dev.key if dev else None):
        say(f"  {line}")


def _table_report(device_key: str | None) -> list[str]:
    from kdispatch.registry import get_op
    from kdispatch.tables import read_table, table_dirs, validate_entries

    lines: list[str] = []
    for d in table_dirs():
        if not d.is_dir():
            continue
        for path in sorted(Path(d).glob("*.json")):
            try:
                table = read_table(path)
                good, rejected = validate_entries(table)
            except (ValueError, OSError) as exc:
                lines.append(f"{path}: MALFORMED: {str(exc).splitlines()[0][:200]}")
                continue
            stale = 0
            for entry, _cfg in good.values():
                try:
                    stale += entry.source_hash != get_op(entry.op).source_hash()
                except ValueError:
                    stale += 1
            problems = []
            if path.stem != table.device.key:
                problems.append(f"file name does not match its device {table.device.key!r}")
            if rejected:
                problems.append(f"{len(rejected)} invalid entries")
            if stale:
                problems.append(f"{stale} stale entries (kernel source changed)")
            if device_key is not None and table.device.key != device_key:
                problems.append(f"other device (this one is {device_key})")
            use = "in use" if device_key == table.device.key and not rejected else "not in use"
            lines.append(f"{path}: {len(table.entries)} entries, device {table.device.key}, "
                         f"{use}" + ("; " + "; ".join(problems) if problems else ""))
    return lines or ["none found in " + ", ".join(str(d) for d in table_dirs())]


if __name__ == "__main__":  # pragma: no cover - python -m kdispatch.cli
    main()
