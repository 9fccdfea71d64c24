"""The source hash covers the code that decides a compiled kernel and its launch: the jit
functions reached and the launch code. Comments, docstrings and formatting do not count."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import kdispatch
from kdispatch.source_hash import code_entries, code_hash

KERNELS = '''
"""Module docstring: {doc}"""
import triton
import triton.language as tl

SCALE = {scale}


@triton.jit
def _helper(x):
    """Helper docstring: {doc}"""
    return x * {factor}  # a comment: {doc}


@triton.jit
def _kernel(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, _helper(tl.load(X + i, mask=i < n)) * SCALE, mask=i < n)


def plan(config, n):
    """Plan docstring: {doc}"""
    # {doc}
    return {{"BLOCK": config * {mapping}}}, (triton.cdiv(n, config),)


def checks(x):
    """Input checks: never part of the hash."""
    if x is None:
        raise ValueError("x: {doc}")
'''


def load(tmp_path: Path, **kw) -> tuple:
    """A fresh module from the template (a new name each time, as after an edit)."""
    values = dict(doc="one", scale=2.0, factor=3.0, mapping=1)
    values.update(kw)
    name = f"kd_hash_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(KERNELS.format(**values)))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod._kernel, mod.plan, mod.checks


def _hash(parts) -> str:
    kernel, plan, _ = parts
    return code_hash([kernel], [plan])


def test_comments_docstrings_and_layout_keep_the_hash(tmp_path):
    base = _hash(load(tmp_path))
    assert _hash(load(tmp_path, doc="an entirely different comment and docstring")) == base


def test_an_edit_of_a_shared_jit_helper_changes_the_hash(tmp_path):
    assert _hash(load(tmp_path)) != _hash(load(tmp_path, factor=4.0))


def test_an_edit_of_the_constexpr_mapping_changes_the_hash(tmp_path):
    assert _hash(load(tmp_path)) != _hash(load(tmp_path, mapping=2))


def test_a_constant_the_kernel_reads_is_part_of_the_hash(tmp_path):
    assert _hash(load(tmp_path)) != _hash(load(tmp_path, scale=3.0))


def test_input_checks_and_unreached_code_are_not(tmp_path):
    kernel, plan, checks = load(tmp_path)
    names = set(code_entries([kernel], [plan]))
    assert {"jit:_kernel", "jit:_helper", "py:plan"} <= names
    assert not any("checks" in n for n in names)


def test_the_builtin_ops_cover_what_changes_their_kernels():
    decode = code_entries(kdispatch.get_op("decode_attention").kernels,
                          kdispatch.get_op("decode_attention").launch_code)
    for name in ("jit:_split_range", "jit:_merge_if_last", "py:shares_latent",
                 "py:interpreting", "py:reduce_shape", "py:plan"):
        assert name in decode, name
    assert not any(n.startswith("py:check") and n != "py:checked_plan" for n in decode)
    assert not any(n in decode for n in ("jit:max", "jit:sum", "jit:zeros"))  # triton's own


def _copy_op(tmp_path: Path, name: str, edit) -> object:
    """A copy of a built-in op package under another name, with ``edit`` applied to each
    module's text, imported fresh."""
    pkg = f"kd_copy_{uuid.uuid4().hex[:8]}"
    src = Path(kdispatch.__file__).parent / "kernels" / name
    dst = tmp_path / pkg
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for f in dst.glob("*.py"):
        text = f.read_text().replace(f"kdispatch.kernels.{name}", pkg)
        f.write_text(edit(f.name, text))
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(pkg).OP
    finally:
        sys.path.remove(str(tmp_path))


def _docstrings_and_comments(fname: str, text: str) -> str:
    """Reword every module docstring and add comments: what a documentation edit does."""
    return ('"""Reworded."""\n# a new comment line\n' + text.split('"""', 2)[2]
            .replace("\n    return", "\n    # explained here\n    return"))


@pytest.mark.parametrize("name", ["decode_attention", "kv_write"])
def test_a_documentation_edit_of_a_builtin_op_keeps_its_hash(tmp_path, name):
    copy = _copy_op(tmp_path, name, _docstrings_and_comments)
    assert copy.source_hash() == kdispatch.get_op(name).source_hash()


def test_the_shipped_h200_table_resolves_from_the_table_after_a_docstring_edit(tmp_path):
    copy = _copy_op(tmp_path, "decode_attention", _docstrings_and_comments)
    original = kdispatch.get_op("decode_attention")
    kdispatch.register(copy, replace=True)
    try:
        kdispatch.reset_dispatcher()
        e = kdispatch.explain("decode_attention", device="nvidia-h200", batch=8,
                              context=327600, num_q_heads=12, num_kv_heads=1, head_dim=576,
                              head_dim_v=512, page_size=16, dtype="bfloat16")
        assert e.provenance == "table", e.consulted
    finally:
        kdispatch.register(original, replace=True)
