"""``python -m kdispatch.cli``."""

from kdispatch.cli import run

run()
