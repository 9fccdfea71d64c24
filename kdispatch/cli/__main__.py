"""``python -m kdispatch.cli``."""

from kdispatch.cli import main

main()
