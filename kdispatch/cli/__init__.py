"""The ``kdispatch`` command line: tune, resolve, explain, show, export, import, merge, doctor,
build-ops.

Every command is a thin layer over library calls. Every failure is one line naming its
cause (``KDISPATCH_DEBUG=1`` shows the traceback); nothing heavy (torch, pydantic,
SQLAlchemy, rich) is imported until a command needs it, so ``kdispatch --help`` is quick.
"""

from __future__ import annotations

from typing import Any

import click

from kdispatch._version import __version__
from kdispatch.cli.common import close_stores, domain_errors


class _Main(click.Group):
    """The root group: any error below a command becomes one line, and the databases a
    command opened are closed when it ends."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with domain_errors():
                return super().invoke(ctx)
        finally:
            close_stores()


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="kdispatch")
def main() -> None:
    """kdispatch: tuned launch configs for Triton kernels (decode attention, KV writes,
    and any op a package defines).

    \b
    Example:
      kdispatch tune --device cpu --preset smoke
      kdispatch resolve decode_attention --device nvidia-h200 --batch 8 --context 327600 \\
          --num-q-heads 12 --num-kv-heads 1 --head-dim 576 --head-dim-v 512
    """


def _register() -> None:
    from kdispatch.cli import doctor, lookup, native, tables, tune

    main.add_command(tune.tune)
    main.add_command(lookup.resolve)
    main.add_command(lookup.explain)
    main.add_command(tables.show)
    main.add_command(tables.export)
    main.add_command(tables.import_)
    main.add_command(tables.merge)
    main.add_command(doctor.doctor)
    main.add_command(native.build_ops)


_register()


def run() -> None:
    """The ``kdispatch`` executable: :func:`main`, then a quick exit once torch is loaded.

    A command that imported torch (a tune, a resolve) has done its work when it returns:
    its databases are closed (:class:`_Main`) and its output is flushed here. The
    interpreter's own teardown with torch, Triton and a CUDA context loaded then takes
    0.5-1 s of the command's wall time (the tune's workers skip it the same way), so the
    process ends with ``os._exit`` and the command's exit code. Without torch loaded it
    exits normally."""
    import logging
    import os
    import sys

    try:
        main.main(prog_name="kdispatch")
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    if "torch" not in sys.modules:
        raise SystemExit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit code 1
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to write to
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover - python -m kdispatch.cli
    run()
