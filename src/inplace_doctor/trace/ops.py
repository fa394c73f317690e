"""What an aten op writes, read from its schema, and the PyTorch quirks about writes."""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat

# In-place ops that change a tensor's metadata or storage pointer but write no
# bytes: they still bump the version counter (so autograd will complain), but
# they cannot corrupt saved values behind the counter's back.
_METADATA_ONLY = frozenset(
    {
        "set_", "resize_", "resize_as_", "as_strided_", "detach_", "squeeze_", "unsqueeze_",
        "t_", "transpose_", "swapdims_", "swapaxes_", "requires_grad_", "sparse_resize_",
        "sparse_resize_and_clear_", "_coalesced_", "retain_grad",
    }
)

WriteSpec = tuple[tuple[str, int], ...]  # (argument name, position) of each written argument
_write_specs: dict[Any, WriteSpec] = {}


def write_spec(func: Any) -> WriteSpec:
    """Which arguments an aten op writes, read from its schema (cached per overload)."""
    spec = _write_specs.get(func)
    if spec is None:
        schema = func._schema
        spec = ()
        if schema.is_mutable:
            spec = tuple(
                (arg.name, i)
                for i, arg in enumerate(schema.arguments)
                if arg.alias_info is not None and arg.alias_info.is_write
            )
        _write_specs[func] = spec
    return spec


_BATCH_NORMS = frozenset(
    {torch.ops.aten.native_batch_norm.default, torch.ops.aten._native_batch_norm_legit.default}
)
# id(op) -> (op, write spec, is a batch norm), read on every op the tracer sees: keyed by id
# because OpOverload hashes in Python; holding the op keeps its id from being reused.
_op_facts: dict[int, tuple[Any, WriteSpec, bool]] = {}


def op_facts(func: Any) -> tuple[Any, WriteSpec, bool]:
    facts = _op_facts.get(id(func))
    if facts is None:
        facts = _op_facts[id(func)] = (func, write_spec(func), func in _BATCH_NORMS)
    return facts


_restore_bump: dict[Any, bool] = {}
_foreach_bump_lost: bool | None = None


def _probe_foreach_bump_lost() -> bool:
    """Does this torch skip the version bump of `_foreach_*_` ops under a Python dispatch mode?

    torch 2.14 does (plain PyTorch bumps them). Without a fix, an optimizer
    step with foreach=True inside the tracer would no longer trip autograd's
    version check: the tool would hide the very error it hunts.
    """

    class _Probe(_compat.TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    t = torch.zeros(1)
    with torch.no_grad(), _Probe():
        torch._foreach_mul_([t], 1.0)
    return t._version == 0


def restores_version_bump(func: Any) -> bool:
    """Whether the tracer must bump the versions `func` writes, as PyTorch would without a mode."""
    global _foreach_bump_lost
    known = _restore_bump.get(func)
    if known is None:
        known = False
        if op_name(func).startswith("aten._foreach_") and write_spec(func):
            if _foreach_bump_lost is None:
                _foreach_bump_lost = _probe_foreach_bump_lost()
            known = _foreach_bump_lost
        _restore_bump[func] = known
    return known


_op_names: dict[Any, str] = {}


def op_name(func: Any) -> str:
    """`aten.relu_`, `aten.add_.Tensor` -> `aten.add_`, `c10d.broadcast_`."""
    name = _op_names.get(func)
    if name is None:
        name = _op_names[func] = func._schema.name.replace("::", ".")
    return name


def writes_bytes(func: Any) -> bool:
    """Whether an in-place op writes bytes (not only metadata: `squeeze_`, `set_`)."""
    return op_name(func).split(".", 1)[-1] not in _METADATA_ONLY


def written_tensors(spec: WriteSpec, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors an op with write spec `spec` writes, in this call."""
    out: list[torch.Tensor] = []
    for name, position in spec:
        value = args[position] if position < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(item for item in value if isinstance(item, torch.Tensor))
    return out
