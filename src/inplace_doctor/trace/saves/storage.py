"""Which bytes of which storage a tensor covers."""

from __future__ import annotations

import torch

from ..._compat import jit_tracing_state as _tracing_state
from ..._compat import set_jit_tracing_state as _set_tracing_state


def storage_span(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage key, first byte, end byte) of the memory a tensor covers, or None."""
    state = _tracing_state()
    if state is not None:  # inside `torch.jit.trace`, sizes read are traced values (and warn): not ours
        _set_tracing_state(None)
        try:
            return storage_span(t)
        finally:
            _set_tracing_state(state)
    inner = _wrapped(t)
    if inner is not t:
        return None if inner is None else storage_span(inner)
    try:
        if t.is_inference():
            return None
        storage = t.untyped_storage()
        numel = t.numel()
        if numel == 0 or storage.nbytes() == 0:
            return None
        size = t.element_size()
        start = int(t.storage_offset())
        if t.is_contiguous():
            extent = numel - 1
        else:
            extent = sum((int(n) - 1) * abs(int(s)) for n, s in zip(t.shape, t.stride()))
        return storage.data_ptr(), start * size, (start + extent + 1) * size
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, meta, no storage
        return None


def storage_key(t: torch.Tensor) -> int:
    """`storage_span(t)[0]` alone, for a tensor autograd saved (never an inference tensor): 0 without storage."""
    inner = _wrapped(t)
    if inner is not t:
        return 0 if inner is None else storage_key(inner)
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, meta, no storage
        return 0


def _wrapped(t: torch.Tensor) -> torch.Tensor | None:
    """The memory a tensor stands for: `t` itself; for a wrapper subclass, which has no storage of its
    own (a `DTensor` parameter under FSDP2 or tensor parallelism), its one inner tensor (the local
    shard), or None when it wraps several or none."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter or not _is_wrapper(t):
        return t
    try:
        names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        inner = [getattr(t, name) for name in names]
    except Exception:  # a subclass whose flatten needs more than it has here
        return None
    return inner[0] if len(inner) == 1 and isinstance(inner[0], torch.Tensor) else None


def _is_wrapper(t: torch.Tensor) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return bool(is_traceable_wrapper_subclass(t))


_EXACT_OVERLAP_LIMIT = 1 << 26  # elements; above this, a shared byte range counts as overlap


def elements_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors on one storage whose byte ranges overlap share an element.

    Strided tensors can interleave without sharing one (the four `unsafe_chunk`
    pieces of a gate matrix along dim 1). Answered exactly by marking `a`'s
    elements in a boolean mask and reading it through `b`'s layout; conservative
    (True) when the dtypes differ in size or the range is too large to mark.
    """
    if a.is_contiguous() and b.is_contiguous():
        return True  # each covers its whole range
    if a.element_size() != b.element_size():
        return True
    from ..._compat import DisableTorchDispatch

    first = min(int(a.storage_offset()), int(b.storage_offset()))
    last = max(last_element(a), last_element(b))
    if last - first + 1 > _EXACT_OVERLAP_LIMIT:
        return True
    with DisableTorchDispatch(), torch.no_grad():
        mask = torch.zeros(last - first + 1, dtype=torch.bool)
        mask.as_strided(a.shape, a.stride(), int(a.storage_offset()) - first).fill_(True)
        return bool(mask.as_strided(b.shape, b.stride(), int(b.storage_offset()) - first).any())


def last_element(t: torch.Tensor) -> int:
    """The storage index of the last element a strided tensor covers."""
    return int(t.storage_offset()) + sum((int(n) - 1) * int(s) for n, s in zip(t.shape, t.stride()))
