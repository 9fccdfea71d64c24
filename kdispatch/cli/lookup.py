"""``kdispatch resolve OP`` and ``kdispatch explain OP``: one subcommand per registered op,
whose options are the op's plain-form arguments (from its ``args_model``)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

import click

from kdispatch.cli.common import domain_errors

_COMMON_HELP = {
    "resolve": "Print the launch config OP gets at these shapes, and its provenance "
               "(database, table, heuristic or override).",
    "explain": "Show the key an OP call maps to, every source consulted and why the config "
               "won.",
}


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """(click type, is a flag) of a plain-args field annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _click_type(args[0])
    if origin is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)]), False
    if annotation is bool:
        return bool, True
    if annotation in (int, float, str):
        return annotation, False
    return str, False


def _options(op: Any) -> list[click.Option]:
    model = op.args_model
    if model is None:
        return []
    out = []
    for name, info in model.model_fields.items():
        ctype, flag = _click_type(info.annotation)
        required = info.is_required()
        default = None if required or info.default is None else info.default
        text = (info.description or name).rstrip(".")
        if default is not None and not flag:
            text += f" [default: {default}]"
        opt = f"--{name.replace('_', '-')}"
        if flag:
            out.append(click.Option([opt], name, is_flag=True, default=None, help=text))
        elif required:  # no default at all: click names the missing option (usage error)
            out.append(click.Option([opt], name, type=ctype, required=True, help=text))
        else:
            out.append(click.Option([opt], name, type=ctype, default=None, help=text))
    return out


def _example(mode: str, op: Any) -> str:
    fields = []
    if op.args_model is not None:
        for name, info in op.args_model.model_fields.items():
            if info.is_required():
                fields.append(f"--{name.replace('_', '-')} N")
    return f"kdispatch {mode} {op.name} --device nvidia-h200 " + " ".join(fields)


def _explanation_json(e: Any) -> dict[str, Any]:
    return {"op": e.op, "key": e.key.model_dump(mode="json"),
            "config": e.config.model_dump(mode="json"), "provenance": e.provenance,
            "origin": e.origin,
            "consulted": [{"source": c.source, "outcome": c.outcome} for c in e.consulted]}


def _explain(op: str, device: str | None, db: str | None, shape: dict[str, Any]) -> Any:
    from kdispatch import api
    from kdispatch.device import Device
    from kdispatch.dispatcher import reset
    from kdispatch.settings import Settings, db_url

    settings = Settings.from_env()
    if db:
        settings = dataclasses.replace(settings, db_url=db_url(db), db_explicit=True)
    reset(settings)
    args = {k: v for k, v in shape.items() if v is not None}
    return api.explain(op, device=device or Device.current().key, **args)


def _print(mode: str, e: Any, as_json: bool) -> None:
    data = _explanation_json(e)
    if as_json:
        if mode == "resolve":
            data = {k: data[k] for k in ("op", "key", "config", "provenance")}
        click.echo(json.dumps(data, indent=1))
        return
    if mode == "explain":
        click.echo(f"op: {e.op}")
        click.echo(f"key: {json.dumps(data['key'], sort_keys=True)}")
        click.echo("consulted:")
        for c in e.consulted:
            click.echo(f"  {c.source}: {c.outcome}")
    click.echo(f"config: {json.dumps(data['config'], sort_keys=True)}")
    suffix = "" if mode == "resolve" or e.origin == e.provenance else f" (from {e.origin})"
    click.echo(f"provenance: {e.provenance}{suffix}")


def _command(mode: str, op: Any) -> click.Command:
    def callback(device: str | None, db: str | None, as_json: bool, **shape: Any) -> None:
        with domain_errors():
            e = _explain(op.name, device, db, shape)
        _print(mode, e, as_json)

    params = [
        click.Option(["--device"], default=None,
                     help="Device key (nvidia-h200, cpu-interpreter, ...); default: this "
                          "machine's."),
        click.Option(["--db"], default=None,
                     help="Database URL or SQLite path (default: KDISPATCH_DB)."),
        click.Option(["--json", "as_json"], is_flag=True, help="Print JSON."),
        *_options(op),
    ]
    return click.Command(op.name, params=params, callback=callback,
                         help=f"{_COMMON_HELP[mode]}\n\n\b\nExample:\n  {_example(mode, op)}",
                         context_settings={"help_option_names": ["-h", "--help"]})


class _OpGroup(click.Group):
    """A group whose subcommands are the registered ops (loaded only when named)."""

    def __init__(self, *args: Any, mode: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.mode = mode

    def list_commands(self, ctx: click.Context) -> list[str]:
        from kdispatch.registry import op_names

        return op_names()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        from kdispatch.registry import get_op

        with domain_errors():
            return _command(self.mode, get_op(name))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Ops"):
            formatter.write_dl([(n, f"{self.mode} {n} (see: kdispatch {self.mode} {n} --help)")
                                for n in self.list_commands(ctx)])


_EXAMPLES = """
    \b
    Examples:
      kdispatch {cmd} decode_attention --device nvidia-h200 --batch 8 --context 327600 \\
          --num-q-heads 12 --num-kv-heads 1 --head-dim 576 --head-dim-v 512
      kdispatch {cmd} kv_write --device cpu-interpreter --tokens 8 --num-kv-heads 16 \\
          --head-dim 128 --json
"""


@click.group(cls=_OpGroup, mode="resolve",
             help=_COMMON_HELP["resolve"] + "\n" + _EXAMPLES.format(cmd="resolve"))
def resolve() -> None:
    pass


@click.group(cls=_OpGroup, mode="explain",
             help=_COMMON_HELP["explain"] + "\n" + _EXAMPLES.format(cmd="explain"))
def explain() -> None:
    pass
