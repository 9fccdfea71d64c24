"""Built-in op packages: one package per op family (kernels, launch, key/config/heuristic/
candidates, reference, input checks, torch op), each declaring its :class:`~kdispatch.opdef.Op`
as ``OP`` in its ``__init__``.

This list is the one place a built-in op is declared; nothing generic names an op. Other
packages declare theirs through the ``kdispatch.ops`` entry point instead.
"""

#: (op name, package) of the built-in ops, imported on first use
BUILTIN_OPS: tuple[tuple[str, str], ...] = (
    ("kv_write", "kdispatch.kernels.kv_write"),
    ("decode_attention", "kdispatch.kernels.decode_attention"),
)
