"""``kdispatch build-ops``: build the native launch cache of the torch ops."""

from __future__ import annotations

import click


@click.command("build-ops")
@click.option("--force", is_flag=True, help="Rebuild even when this build exists.")
def build_ops(force: bool) -> None:
    """Build the native launch cache that the torch ops' CUDA calls run through.

    Needs a C++ compiler (``CXX``, else ``c++``), no CUDA toolkit. The library goes to
    ``$XDG_CACHE_HOME/kdispatch/native`` (``KDISPATCH_NATIVE_DIR`` overrides), one build per
    kdispatch source and torch version; processes that import kdispatch afterwards load it
    (``KDISPATCH_FAST_OPS=0`` keeps the Python path).

    \b
    Example:
      kdispatch build-ops
    """
    import torch

    from kdispatch.native.build import build, enabled

    path = build(force=force)
    torch.ops.load_library(str(path))  # a library that builds but does not load fails here
    click.echo(f"built {path}")
    if not enabled():
        click.echo("note: KDISPATCH_FAST_OPS=0 is set: this process's environment does "
                   "not load it")
