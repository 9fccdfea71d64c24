"""Imported by the compile pool's fork server, and nowhere else (see
:mod:`kdispatch.tuning.pool_start`): the fork server takes module names to preload, so
this module's import does what every pool process would do first, once, before the server
forks them. The kernels are imported in compiled mode (the pool compiles for a GPU target,
also from a tuner that runs the Triton interpreter itself)."""

import os

os.environ.pop("TRITON_INTERPRET", None)

from kdispatch.tuning.precompile import warm_up  # after the mode is chosen

warm_up()
