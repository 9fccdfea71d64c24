"""Two dispatched ops defined outside kdispatch, the two ways kdispatch offers.

- ``example.rmsnorm`` (:mod:`.rmsnorm`): the light form, ``@kdispatch.dispatch`` over a
  ``@triton.jit`` kernel, a drop-in for ``triton.autotune``.
- ``example.softmax`` (:mod:`.softmax`): the full form, an :class:`kdispatch.Op` with its
  :class:`kdispatch.OpTuning`, a plain-form argument model and its own launch plan.

Both ship their tuned rows in ``tables/`` (found through each op's ``table_dirs``), and
the package declares them through the ``kdispatch.ops`` entry point (pyproject.toml), so
``kdispatch tune --op example.rmsnorm``, ``resolve``, ``explain``, ``show`` and ``export``
work for them once the package is installed.
"""

from kdispatch_example_ops.rmsnorm import RMSNORM, rmsnorm
from kdispatch_example_ops.softmax import SOFTMAX, softmax

#: the ops this package defines (its entry points name each one)
OPS = [RMSNORM, SOFTMAX]

__all__ = ["OPS", "RMSNORM", "SOFTMAX", "rmsnorm", "softmax"]
