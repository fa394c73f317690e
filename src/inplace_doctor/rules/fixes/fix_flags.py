"""The fix for a module built with `inplace=True`: the literal flag in its constructor call, turned off."""

from __future__ import annotations

import ast

from ...findings import Applicability, Fix, FixKind
from ...sites import Frame
from .source import read, statement_at


def flag_at_constructor(origin: Frame | None, module_type: str | None = None) -> Fix:
    """`inplace=True` -> `inplace=False` (or `nn.ReLU(True)` -> `nn.ReLU(False)`) in the constructor
    call on the line the module was constructed from, however many lines that call spans (manual
    without a literal there, or with two such calls on the line: which one ran is not known)."""
    if origin is None:
        return Fix(FixKind.FLAG_OFF_AT_CONSTRUCTOR)
    source = read(origin.file)
    located = statement_at(source, origin.line) if source is not None else None
    if source is None or located is None:
        return Fix(FixKind.FLAG_OFF_AT_CONSTRUCTOR)
    flags = [
        flag for n in ast.walk(located.node)
        if isinstance(n, ast.Call) and n.lineno <= origin.line <= (n.end_lineno or n.lineno)
        and (flag := _inplace_true(n, module_type)) is not None
    ]
    if len(flags) != 1:
        return Fix(FixKind.FLAG_OFF_AT_CONSTRUCTOR)
    return Fix(FixKind.FLAG_OFF_AT_CONSTRUCTOR, (source.replace(flags[0], "False"),), Applicability.UNSAFE)


def _inplace_true(call: ast.Call, module_type: str | None) -> ast.expr | None:
    """The literal True `call` passes for `inplace`: by keyword, or by position in a call naming
    `module_type`, a torch.nn module whose signature says where `inplace` stands."""
    for kw in call.keywords:
        if kw.arg == "inplace":
            return kw.value if _is_true(kw.value) else None
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    index = _inplace_position(module_type) if name is not None and name == module_type else None
    if index is None or index >= len(call.args) or any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return None
    return call.args[index] if _is_true(call.args[index]) else None


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _inplace_position(module_type: str | None) -> int | None:
    """Where `inplace` stands among the positional parameters of torch.nn's `module_type`."""
    import inspect

    import torch

    cls = getattr(torch.nn, module_type or "", None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:] if p.kind in kinds]
    return names.index("inplace") if "inplace" in names else None
