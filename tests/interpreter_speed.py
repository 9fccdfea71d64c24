"""Test-only speed-up of the Triton 3.6 interpreter: ``triton.language`` is patched once per
kernel launch, not again at every ``@triton.jit`` helper call inside it.

How the interpreter runs a launch (``triton/runtime/interpreter.py``): ``GridExecutor``
calls ``_patch_lang(kernel)``, which replaces every builtin of ``tl``, ``tl.tensor`` and
``tl.math`` (found with ``inspect.getmembers``) by a wrapper, runs every program, and then
undoes it. Each call of a jit helper inside a program (``InterpretedFunction.__call__``:
``_tile_rows``/``_split_range`` here, and the combine functions of ``tl.max``/``tl.sum``,
which live in ``triton.language.standard`` and see ``tl.core``) calls ``_patch_lang(helper)``
again and drops the scope it returns, so what it patches is never undone. From the second
such call on in a launch it finds nothing left to patch (a patched member is no longer a
builtin) and only sets a few attributes again to equivalent lambdas -- yet it walks the
modules with ``getmembers`` each time: about a third of the interpreter's time on the
decode kernels.

:func:`install` skips exactly those repeats: a helper call during a launch (same thread)
whose language modules the launch, or an earlier helper call of the same launch, has
already patched. Every other call -- the launch's own patch, a helper call outside a
launch, the first helper call of a launch that sees another language module -- goes to
Triton's ``_patch_lang`` unchanged, so each launch ends in the same patched/unpatched state
as before. The kernels run the same interpreted code with the same semantics (the
interpreter's integer-overflow checks included); only the redundant re-patching goes.

Installed by ``tests/conftest.py`` when the interpreter is in use, only with Triton 3.6.x
(the version whose interpreter this was read against); ``KDISPATCH_TEST_PLAIN_INTERPRETER=1``
turns it off. Child processes the tests start (the CLI, tuner workers) do not get it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading

_state = threading.local()  # .active: per running launch, the language modules patched


def _langs(fn) -> frozenset[int]:
    """The ids of the language modules ``_patch_lang(fn)`` patches (its own rule)."""
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values()
                     if inspect.ismodule(v) and v in (tl, tl.core))


def install() -> bool:
    """Patch this process's interpreter; False (and no change) where it does not apply."""
    if os.environ.get("KDISPATCH_TEST_PLAIN_INTERPRETER") == "1":
        return False
    try:
        import triton
        from triton.runtime import interpreter as itp

        original = itp._patch_lang
        helper_code = itp.InterpretedFunction.__call__.__code__
        launch_code = itp.GridExecutor.__call__.__code__
        scope_cls = itp._LangPatchScope
    except (ImportError, AttributeError):
        return False
    if not triton.__version__.startswith("3.6."):
        return False
    if getattr(original, "_kdispatch_tests", False):
        return True

    class _LaunchScope(scope_cls):
        """The launch's own scope; restoring it also ends the launch's record."""

        def restore(self) -> None:
            try:
                super().restore()
            finally:
                _state.active.pop()

    def _patch_lang(fn):
        caller = sys._getframe(1).f_code
        active = getattr(_state, "active", None)
        if caller is helper_code and active:
            langs = _langs(fn)
            if langs <= active[-1]:
                return scope_cls()  # nothing to patch; the caller drops it unrestored
            scope = original(fn)
            active[-1] = active[-1] | langs
            return scope
        scope = original(fn)
        if caller is launch_code:
            launch = _LaunchScope()
            launch._changes = scope._changes
            if active is None:
                active = _state.active = []
            active.append(_langs(fn))
            return launch
        return scope

    _patch_lang._kdispatch_tests = True
    _patch_lang.original = original
    itp._patch_lang = _patch_lang
    return True


@contextlib.contextmanager
def plain():
    """Triton's own ``_patch_lang`` for the ``with`` block (for the test that compares)."""
    from triton.runtime import interpreter as itp

    patched = itp._patch_lang
    itp._patch_lang = getattr(patched, "original", patched)
    try:
        yield
    finally:
        itp._patch_lang = patched
