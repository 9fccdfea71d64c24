"""The hash that makes a tuned row stale: the code that decides a compiled kernel and its launch.

:func:`code_hash` hashes the *syntax tree* of

- every ``@triton.jit`` function an op launches and every jit function those call (but
  Triton's own, whose version every row records), with the values of the module-level
  constants they read (Triton bakes them in), and
- the op's launch code (the functions that turn a config into constexprs, a grid and a
  kernel choice) and the functions of the op's own package, or of ``kdispatch.kernels``,
  that it calls, with the constants they read;

never the text of a module: comments, docstrings, blank lines and formatting do not count,
and neither do input checks or anything the launch code does not reach. The tree is
serialized field by field with the fields that differ between Python versions left out,
so a table tuned under one Python resolves under another.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
import tokenize
import types
from collections.abc import Callable, Iterable
from io import StringIO
from typing import Any

#: AST fields that carry no meaning for the code, or differ between Python versions
_SKIP_FIELDS = frozenset({"ctx", "type_comment", "type_params", "kind", "type_ignores"})
_SHARED_PREFIX = "kdispatch.kernels"


def _jit_python_fn(obj: Any) -> Callable[..., Any] | None:
    """The Python function behind a Triton or Gluon jit function (compiled or interpreted),
    else None."""
    cls = type(obj).__name__
    if (cls in ("JITFunction", "InterpretedFunction", "GluonJITFunction")
            and callable(getattr(obj, "fn", None))):
        return obj.fn
    return None


def _is_docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _canon(node: Any) -> str:
    """A version-stable serialization of an AST node (bare string statements dropped)."""
    if isinstance(node, ast.AST):
        parts = [type(node).__name__]
        for field in node._fields:
            if field in _SKIP_FIELDS:
                continue
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                value = [s for s in value if not _is_docstring(s)]
            if value is None or value == []:
                continue
            parts.append(f"{field}={_canon(value)}")
        return "(" + " ".join(parts) + ")"
    if isinstance(node, list):
        return "[" + ",".join(_canon(x) for x in node) + "]"
    return f"{type(node).__name__}:{node!r}"


def _tokens_canon(src: str) -> str:
    """Source text without comments and layout (for code whose text does not parse alone,
    such as a lambda inside a call)."""
    keep = []
    for tok in tokenize.generate_tokens(StringIO(src).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        keep.append(tok.string)
    return " ".join(keep)


def _function_tree(fn: Callable[..., Any]) -> tuple[str, ast.AST | None]:
    """(canonical text, tree or None) of ``fn``'s definition."""
    src = textwrap.dedent(inspect.getsource(fn))
    try:
        tree = ast.parse(src)
    except SyntaxError:  # a lambda cut out of a longer expression
        return _tokens_canon(src.strip()), None
    return _canon(tree), tree


def _is_constant(value: Any) -> bool:
    if type(value).__name__ == "constexpr":  # triton.language.constexpr
        value = getattr(value, "value", value)
    if isinstance(value, bool | int | float | str | type(None)):
        return True
    return isinstance(value, tuple) and all(_is_constant(v) for v in value)


def _referenced(tree: ast.AST | None, fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """(dotted name, value) of the module-level objects ``fn`` reads by name or attribute."""
    names: set[str] = set()
    if tree is None:
        names = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
    else:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                chain = []
                cur: ast.AST = node
                while isinstance(cur, ast.Attribute):
                    chain.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name):
                    names.add(".".join([cur.id, *reversed(chain)]))
    scope = getattr(fn, "__globals__", {})
    out = []
    for dotted in sorted(names):
        head, *rest = dotted.split(".")
        if head not in scope:
            continue
        value = scope[head]
        for attr in rest:  # only through modules (``mod.helper``), never into objects
            if not isinstance(value, types.ModuleType):
                break
            value = getattr(value, attr, None)
        else:
            out.append((dotted, value))
    return out


def code_hash(kernels: Iterable[Any], launch_code: Iterable[Callable[..., Any]] = (),
              salt: str = "") -> str:
    """sha256 (16 hex) over the kernels and launch code an op declares, and what they reach.

    See :func:`code_entries` for what is included.
    """
    entries = code_entries(kernels, launch_code)
    h = hashlib.sha256(salt.encode())
    for name in sorted(entries):
        h.update(name.encode() + b"\0" + entries[name].encode() + b"\0")
    return h.hexdigest()[:16]


def code_entries(kernels: Iterable[Any], launch_code: Iterable[Callable[..., Any]] = (),
                 ) -> dict[str, str]:
    """``{name: canonical text}`` of everything :func:`code_hash` covers.

    Parameters
    ----------
    kernels : iterable
        ``@triton.jit`` functions; every jit function they reference is included.
    launch_code : iterable of callables
        Plain functions; the functions they reference that live in their own package (or
        in ``kdispatch.kernels``) are included, as are jit functions they name.
    """
    entries: dict[str, str] = {}
    launch = list(launch_code)
    prefixes = {_SHARED_PREFIX}
    for fn in launch:
        mod = getattr(fn, "__module__", "") or ""
        prefixes.add(mod.rsplit(".", 1)[0] if "." in mod else mod)
    todo: list[tuple[Any, bool]] = [(k, True) for k in kernels] + [(f, False) for f in launch]
    while todo:
        obj, is_jit = todo.pop()
        fn = _jit_python_fn(obj) if is_jit else obj
        if fn is None:
            raise TypeError(f"kernels: {obj!r} is not a @triton.jit function")
        name = f"{'jit' if is_jit else 'py'}:{getattr(fn, '__qualname__', repr(fn))}"
        if name in entries:
            continue
        text, tree = _function_tree(fn)
        entries[name] = text
        for dotted, value in _referenced(tree, fn):
            inner = _jit_python_fn(value)
            if inner is not None:
                if not (inner.__module__ or "").startswith("triton."):  # rows key triton
                    todo.append((value, True))
            elif _is_constant(value):
                entries[f"const:{name}:{dotted}"] = repr(getattr(value, "value", value))
            elif (not is_jit and isinstance(value, types.FunctionType)
                  and any((value.__module__ or "").startswith(p) for p in prefixes)):
                todo.append((value, False))
    return entries
