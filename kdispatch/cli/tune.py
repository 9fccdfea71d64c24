"""``kdispatch tune``: measure every candidate config of the chosen keys into the database."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from kdispatch.cli.common import (compact, console, domain_errors, open_store, shape_fields,
                                  split, us)


@click.command()
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
@click.option("--op", "ops", default=None,
              help="Comma-separated ops to tune (default: all); without --preset, each op's "
                   "own default keys.")
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
      kdispatch tune --device cuda:0 --op mypkg.rmsnorm
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
    names, op_list = split(presets), split(ops)
    if not names and not from_misses and not op_list:
        raise click.UsageError("choose --preset NAME[,NAME], --op NAME or --from-misses "
                               f"(presets: {', '.join(presets_mod.preset_names())})")
    if budget_minutes is not None and budget_minutes <= 0:
        raise click.BadParameter("must be > 0", param_hint="--budget-minutes")
    if shards is not None and (ray_address is None or shards < 1):
        raise click.BadParameter("needs --ray and a value >= 1", param_hint="--shards")
    plan = {"presets": names, "ops": op_list or None, "from_misses": from_misses,
            "max_candidates": max_candidates}
    run = {"budget_minutes": budget_minutes, "seed": seed, "mark_misses": from_misses}
    with domain_errors():
        from kdispatch.tuning import parallel, sweep
        from kdispatch.tuning.devices import input_budget

        ui = _Reporter(console())
        if ray_address is not None:
            from kdispatch.tuning import ray_runner

            runs, results = ray_runner.tune_cluster(device, ray_address or None, shards,
                                                    max_retries, open_store(db), plan, run, ui)
            return ui.finish(runs, results, budget_minutes)
        if parallel.is_multi_device(device):
            runs, results = parallel.tune_devices(device, open_store(db), plan, run, ui)
            return ui.finish(runs, results, budget_minutes)
        dev, tdev = sweep.resolve_device(device)
        store = open_store(db)
        targets, notes = parallel.plan_targets(store, dev, **plan,
                                               max_input_bytes=input_budget(tdev))
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

    def __init__(self, console: Any):
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
                           f"{dev.cu_count} CUs{where}) into {store.name}", highlight=False)
        return True

    @contextmanager
    def bar(self) -> Iterator[tuple[Any, Any]]:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

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


def _progress_cb(bar: Any, task: Any) -> Callable[[Any], None]:
    def cb(p: Any) -> None:
        shape = compact(shape_fields(p.key))
        eta = "?" if p.eta_s is None else f"{p.eta_s:,.0f}s"
        bar.update(task, total=p.total, completed=p.done, eta=eta,
                   description=f"[{p.key_index + 1}/{p.key_count}] {p.op} {shape}"[:90])
    return cb


def _summary_table(summaries: list[Any]) -> Any:
    from rich.table import Table

    table = Table(title="tuning summary")
    for col in ("op", "key", "best config", "best us", "heuristic us", "speedup", "ok/rej/inf"):
        table.add_column(col, overflow="fold", no_wrap=col == "op")
    for s in summaries:
        sp = s.speedup
        table.add_row(s.op, compact(shape_fields(s.key)), compact(s.best_config),
                      us(s.best_us), us(s.heuristic_us), "-" if sp is None else f"{sp:.2f}x",
                      f"{s.ok}/{s.rejected}/{s.infeasible}")
    return table


