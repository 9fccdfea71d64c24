"""The package's shape: no import cycles (imports inside functions count), generic modules
that never name an op, and modules of a readable size."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kdispatch"
GENERIC = ("api", "buckets", "device", "dispatcher", "dtypes", "errors", "kernel_op", "table_cache",
           "launching", "memo", "misses", "opdef", "paths", "registry", "settings",
           "source_hash", "tables", "tensor_guard", "torch_library", "store", "tuning", "cli",
           "native")
OP_NAMES = ("decode_attention", "kv_write", "write_kv")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """kdispatch modules ``path`` imports anywhere (functions included, TYPE_CHECKING-only
    blocks excluded: they never run)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if _type_checking(node):
            skip |= {id(n) for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import submodule`` depends on the submodule; ``from mod import
            # name`` on the module
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [s for s in subs if s in modules] or [node.module]
            if any(s not in modules for s in subs):
                names.append(node.module)
        else:
            continue
        out |= {n for n in names if n in modules}
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_not_even_inside_functions():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _generic_files() -> list[Path]:
    out = []
    for name in GENERIC:
        p = PKG / name
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p.with_suffix(".py")]
    return out


@pytest.mark.parametrize("path", _generic_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_generic_modules_never_name_an_op(path):
    """Code and strings alike, except the CLI's help examples (text a user reads)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if path.parent.name == "cli" and "kdispatch " in node.value:
                continue  # a usage example in --help text
            hits = [n for n in OP_NAMES if n in node.value]
            assert not hits, f"{path.name}:{node.lineno} names {hits}: {node.value[:80]!r}"
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            assert name not in OP_NAMES, f"{path.name}:{node.lineno} uses {name}"


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    generic = path in _generic_files()
    assert lines <= (400 if generic else 600), f"{path.relative_to(PKG)}: {lines} lines"
