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
@click.option("--max-candidates", default=None, metavar="N|all",
              help="Cap candidates per key (heuristic and baseline always kept), or all. "
                   "[default: each key's full valid space when its estimated time fits "
                   "--budget-minutes (30 minutes without one), else the presets' caps; the "
                   "caps on the interpreter]")
@click.option("--compile-workers", type=int, default=None, metavar="N",
              help="Processes compiling every candidate's kernels ahead into the Triton "
                   "cache, shared by all GPUs of the host; 0 compiles at launch instead. "
                   "[default: the CPU cores less one per GPU; GPUs only, not with --ray]")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option("--list-presets", is_flag=True,
              help="List the presets and exit; with --device (a GPU, cpu or a device key "
                   "such as nvidia-h200), their keys and candidate counts on it.")
def tune(device: str, ray_address: str | None, shards: int | None, max_retries: int,
         presets: str | None, ops: str | None, db: str | None, budget_minutes: float | None,
         from_misses: bool, max_candidates: str | None, compile_workers: int | None,
         seed: int, list_presets: bool) -> None:
    """Measure every candidate config of the chosen keys into the database.

    Each candidate is checked against the fp32 reference first (wrong ones are recorded as
    rejected, compile/resource failures as infeasible), then timed. On a GPU, a pool of
    processes compiles every candidate's kernels ahead while the GPU times (a kernel the
    compiler rejects is recorded infeasible). Every measurement is committed at once; a
    rerun resumes where a killed run stopped. Several devices (or Ray tasks) split the keys
    between them and write to one database; identical devices fill one table.

    \b
    Examples:
      kdispatch tune --device cpu --preset smoke
      kdispatch tune --device cuda:0 --preset llama3-8b,kimi-k3-tp8 --budget-minutes 9
      kdispatch tune --device cuda:0 --preset llama3-8b --max-candidates 6
      kdispatch tune --list-presets --device nvidia-h200
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
        return _list_presets(device)
    names, op_list = split(presets), split(ops)
    if not names and not from_misses and not op_list:
        raise click.UsageError("choose --preset NAME[,NAME], --op NAME or --from-misses "
                               f"(presets: {', '.join(presets_mod.preset_names())})")
    if budget_minutes is not None and budget_minutes <= 0:
        raise click.BadParameter("must be > 0", param_hint="--budget-minutes")
    if shards is not None and (ray_address is None or shards < 1):
        raise click.BadParameter("needs --ray and a value >= 1", param_hint="--shards")
    if compile_workers is not None and compile_workers < 0:
        raise click.BadParameter("must be >= 0", param_hint="--compile-workers")
    if compile_workers and ray_address is not None:
        raise click.BadParameter("not with --ray (each task compiles its own kernels)",
                                 param_hint="--compile-workers")
    cap, mode = _cap(max_candidates)
    with domain_errors():
        # the compile pool (and the workers of several devices) start before this process
        # imports torch and the tuner (seconds), so their start-up overlaps it
        from kdispatch.tuning.devices import is_multi_device
        from kdispatch.tuning.pool_settings import CompileSettings, open_pool

        settings = CompileSettings(workers=compile_workers)
        run = {"budget_minutes": budget_minutes, "seed": seed, "mark_misses": from_misses}
        if ray_address is None and is_multi_device(device):
            from kdispatch.tuning.workers import start_devices

            with start_devices(device, settings) as started:
                ui = _Reporter(console())  # rich, once the workers are starting
                from kdispatch.tuning import parallel

                runs, results = parallel.tune_devices(
                    device, open_store(db), _plan(names, op_list, from_misses, cap, mode,
                                                  budget_minutes),
                    {**run, "compile_settings": settings}, ui, started=started)
                # printed while the workers exit (their processes are joined after it)
                return ui.finish(runs, results, budget_minutes)
        if ray_address is not None:  # each task compiles its own kernels at launch
            from kdispatch.tuning import ray_runner

            ui = _Reporter(console())
            runs, results = ray_runner.tune_cluster(
                device, ray_address or None, shards, max_retries, open_store(db),
                _plan(names, op_list, from_misses, cap, mode, budget_minutes), run, ui)
            return ui.finish(runs, results, budget_minutes)
        # the interpreter, on a cpu device, compiles nothing ahead
        interpreter = device.strip().lower() in ("cpu", "interpreter", "cpu-interpreter")
        with open_pool(settings, interpreter=interpreter) as pool:
            ui = _Reporter(console())  # rich, once the pool is starting
            from kdispatch.tuning import parallel, sweep
            from kdispatch.tuning.devices import input_budget
            from kdispatch.tuning.estimate import SpaceRule
            from kdispatch.tuning.throughput import process_age

            dev, tdev = sweep.resolve_device(device)
            store = open_store(db)
            plan = _plan(names, op_list, from_misses, cap, mode, budget_minutes)
            plan["space"] = SpaceRule(mode, budget_minutes, settings.workers_for(
                1, dev.is_interpreter))
            targets, notes = parallel.plan_targets(store, dev, **plan,
                                                   max_input_bytes=input_budget(tdev))
            if not ui.announce(dev, targets, notes, store, from_misses):
                return
            with ui.progress() as on_update:
                started = process_age()
                result = sweep.tune(targets, device=dev, torch_device=tdev, store=store,
                                    progress=_progress_cb(on_update, ui, pool),
                                    precompile=pool, **run)
                result.throughput.start_s = started
        ui.console.print(_summary_table(result.summaries))
        ui.report(result.measured, result.skipped, f"run {result.run_id}",
                  result.stopped == "budget", budget_minutes)
        ui.throughput(result.throughput)


def _plan(names: list[str], ops: list[str], from_misses: bool, cap: int | None, mode: Any,
          budget_minutes: float | None) -> dict[str, Any]:
    """Keyword arguments of :func:`~kdispatch.tuning.parallel.plan_targets`."""
    from kdispatch.tuning.estimate import SpaceRule

    return {"presets": names, "ops": ops or None, "from_misses": from_misses,
            "max_candidates": cap, "space": SpaceRule(mode, budget_minutes)}


def _cap(value: str | None) -> tuple[int | None, Any]:
    """``--max-candidates``: (cap, space mode)."""
    if value is None:
        return None, "auto"
    if value.strip().lower() == "all":
        return None, "full"
    try:
        cap = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a number or all, got {value!r}",
                                 param_hint="--max-candidates") from None
    if cap < 1:
        raise click.BadParameter("must be >= 1 (or all)", param_hint="--max-candidates")
    return cap, "capped"


def _list_presets(device: str) -> None:
    """Print the presets; for a known device, each one's keys and candidate counts."""
    from kdispatch.tuning import presets as presets_mod

    dev = None
    if device.strip().lower() != "auto" or _has_gpu():
        with domain_errors():
            dev = _listing_device(device)
    for name in presets_mod.preset_names():
        click.echo(f"{name}: {presets_mod.get_preset(name).description}")
        if dev is not None:
            with domain_errors():
                click.echo(f"  {_preset_counts(dev, name)}")
    if dev is None:
        click.echo("(add --device nvidia-h200, a GPU or cpu for keys and candidate counts)")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _listing_device(device: str) -> Any:
    from kdispatch.device import Device
    from kdispatch.tuning import sweep

    name = device.strip().lower()
    if name in ("auto", "cpu", "cuda") or name.startswith("cuda:"):
        return sweep.resolve_device(name)[0]
    return Device.from_key(name)


def _preset_counts(dev: Any, name: str) -> str:
    from kdispatch.tuning.estimate import space_sizes
    from kdispatch.tuning.plan import plan

    targets, _ = plan(dev, [name])
    size = space_sizes(targets)
    cap = next((t.max_candidates for t in targets if t.max_candidates is not None), None)
    capped = f"{size.capped} with at most {cap} per key; " if cap is not None else ""
    return f"on {dev.key}: {size.keys} keys, {capped}{size.full} in the full valid space"


class _Reporter:
    """What the tuner shows while it plans and runs: notes, the plan, one progress bar."""

    def __init__(self, console: Any):
        self.console = console
        self._bar: Any = None
        self._compile_task: Any = None
        self.pool_stats: Any = None
        self.wall_s = 0.0

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
                      TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                      console=self.console, transient=False) as bar:
            self._bar, self._compile_task = bar, None
            try:
                yield bar, bar.add_task("timing", total=None, eta="ETA ?")
            finally:
                self._bar = None

    @contextmanager
    def progress(self) -> Iterator[Callable[[int, int | None, str], None]]:
        """``on_update(done, total, description)``: candidates timed, over all workers."""
        t0 = time.monotonic()
        self.pool_stats = None
        try:
            with self.bar() as (bar, task):
                def update(done: int, total: int | None, desc: str) -> None:
                    elapsed = time.monotonic() - t0
                    eta = (f"ETA {elapsed / done * (total - done):,.0f}s" if total and done
                           else "ETA ?")
                    bar.update(task, total=total, completed=done, eta=eta,
                               description=f"timing {desc}"[:90])
                yield update
        finally:
            self.wall_s = time.monotonic() - t0

    def compiling(self, stats: Any) -> None:
        """The compile pool's progress: a bar of its own, above the timing one."""
        self.pool_stats = stats
        if self._bar is None or stats is None or not stats.submitted:
            return
        if self._compile_task is None:
            self._compile_task = self._bar.add_task("compiling", total=None, eta="")
        self._bar.update(self._compile_task, total=stats.submitted, completed=stats.done,
                         description=f"compiling kernels in {stats.workers} processes",
                         eta=f"{stats.failed} failed" if stats.failed else "")

    def report(self, measured: int, skipped: int, run: str, budget_hit: bool,
               budget_minutes: float | None) -> None:
        self.console.print(f"measured {measured} candidates, {skipped} already in the "
                           f"database ({run})", highlight=False)
        if budget_hit:
            self.console.print(f"[yellow]stopped: the {budget_minutes:g}-minute budget is "
                               "spent; rerun to resume[/]")

    def throughput(self, thr: Any) -> None:
        """The run's throughput line; with a compile pool, what the timing processes spent
        describing keys for it and waiting for its kernels (a line of its own)."""
        self.console.print(thr.line(), highlight=False, soft_wrap=True)
        self.console.print(thr.startup_line(), highlight=False, soft_wrap=True)
        if len(thr.workers) > 1:
            self.console.print(thr.worker_line(), highlight=False, soft_wrap=True)
        if thr.pool:
            self.console.print(f"compiling ahead: {thr.describe_s:.1f} s describing keys for "
                               f"the pool, {thr.wait_s:.1f} s waiting for kernels",
                               highlight=False, soft_wrap=True)

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
        if results:
            from kdispatch.tuning.throughput import Throughput

            pool = self.pool_stats.as_dict() if self.pool_stats is not None else None
            parts = [r.counts["throughput"] for r in results
                     if r.counts and "throughput" in r.counts]
            self.throughput(Throughput.merge(parts, self.wall_s, pool))
        failed = parallel.failure_message(results)
        if failed:
            raise click.ClickException(failed)


def _progress_cb(on_update: Callable[[int, int | None, str], None], ui: _Reporter,
                 pool: Any) -> Callable[[Any], None]:
    """The single-device sweep's progress: the key and phase, and the pool's own bar."""
    def cb(p: Any) -> None:
        shape = compact(shape_fields(p.key))
        wait = "(waiting for its kernels) " if p.phase == "compiling" else ""
        on_update(p.done, p.total, f"{wait}[{p.key_index + 1}/{p.key_count}] {p.op} {shape}")
        if pool is not None:
            ui.compiling(pool.stats())
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


