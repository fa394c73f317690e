"""Every private PyTorch API inplace-doctor relies on, checked once at import.

If a PyTorch release renames one of these, the tool fails here with a message
naming the torch version, instead of misbehaving deep inside a user's run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from .errors import TorchIncompatibleError

TORCH_VERSION = torch.__version__


def _require(obj: Any, name: str, what: str) -> Any:
    value = getattr(obj, name, None)
    if value is None:
        raise TorchIncompatibleError(
            f"inplace-doctor needs {what} ({name}), which torch {TORCH_VERSION} does not "
            "provide; install torch>=2.6,<=2.14.1 (the versions it is tested on)."
        )
    return value


_autograd = torch._C._autograd

#: Called with every autograd node right after it is created, when its saved
#: tensors are already packed: the exact moment to name what each node saved.
push_node_creation_hook: Callable[[Callable[[Any], None]], None] = _require(
    _autograd, "_push_node_creation_hook", "autograd's node-creation hook"
)
pop_node_creation_hook: Callable[[], None] = _require(
    _autograd, "_pop_node_creation_hook", "autograd's node-creation hook"
)
#: The node whose backward is running on this thread, or None during forward.
current_autograd_node: Callable[[], Any] = _require(
    torch._C, "_current_autograd_node", "the current-autograd-node query"
)
#: The id of the backward graph task running on this thread (-1 outside backward).
current_graph_task_id: Callable[[], int] = _require(
    torch._C, "_current_graph_task_id", "the current-backward-graph-task query"
)
#: Runs a callable when the backward graph task now running ends (what DDP and FSDP use).
queue_backward_callback: Callable[[Callable[[], None]], None] = _require(
    torch.autograd.Variable._execution_engine, "queue_callback", "the end-of-backward callback queue"
)
#: The saved-tensor object behind `node._raw_saved_<field>`; `.data` is what the
#: pack hook returned, read without unpacking (so no checkpoint recompute).
SavedTensor: Any = _require(_autograd, "SavedTensor", "autograd's SavedTensor type")

_require(SavedTensor, "data", "SavedTensor.data")
_require(SavedTensor, "unpack_hook", "SavedTensor.unpack_hook")

#: Context manager: ops inside skip every Python dispatch mode (the tool's own
#: bookkeeping ops must not be recorded, and re-entering the mode is costly).
DisableTorchDispatch: Any = _require(torch._C, "_DisableTorchDispatch", "the dispatch-mode guard")
#: The `torch.jit.trace` recording now running on this thread, or None.
jit_tracing_state: Callable[[], Any] = _require(torch._C, "_get_tracing_state", "the jit tracing-state query")
set_jit_tracing_state: Callable[[Any], None] = _require(torch._C, "_set_tracing_state", "the jit tracing-state switch")
#: How many Python dispatch modes this thread has on (0: none would see an op, no guard needed).
dispatch_mode_count: Callable[[], int] = _require(torch._C, "_len_torch_dispatch_stack", "the dispatch-mode stack")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

#: This thread's dispatch-mode stack, without `TorchDispatchMode.__enter__`'s process-wide flags
#: (which a mode entered and left in another thread would leave wrong for this one).
push_dispatch_mode: Callable[[Any], None] = _require(
    torch._C, "_push_on_torch_dispatch_stack", "the dispatch-mode stack"
)
pop_dispatch_mode: Callable[[Any], Any] = _require(torch._C, "_pop_torch_dispatch_stack", "the dispatch-mode stack")

#: Captures the current Python stack in C (code objects and instruction
#: offsets, no frame objects, so no locals kept alive); `symbolize_tracebacks`
#: turns captures into file/line/name only when a finding needs them.
gather_traceback: Callable[..., Any] = _require(torch._C._profiler, "gather_traceback", "the C stack capture")
symbolize_tracebacks: Callable[[list[Any]], list[list[dict[str, Any]]]] = _require(
    torch._C._profiler, "symbolize_tracebacks", "the C stack capture's symbolizer"
)

_SET_VERSION: Callable[..., None] = _require(
    torch._C._autograd, "_unsafe_set_version_counter", "the version-counter setter"
)


def set_versions(tensors: list[torch.Tensor], versions: list[int]) -> None:
    """Set each tensor's version counter (shared with its views) to its number: for memory whose
    bytes were put back exactly, so that a graph that saved it before still accepts it."""
    try:
        _SET_VERSION(tuple(tensors), tuple(versions))
    except TypeError:  # torch before 2.5 took one tensor and one number
        for t, v in zip(tensors, versions):
            _SET_VERSION(t, v)


_require(torch.autograd.graph, "saved_tensors_hooks", "saved-tensor hooks")
_require(torch.nn.modules.module, "register_module_forward_pre_hook", "global module hooks")
_require(torch.nn.modules.module, "register_module_forward_hook", "global module hooks")


def _forward_hook_runners() -> frozenset[Any]:
    # `Module._call_impl(self, *args, **kwargs)` runs the global forward pre-hooks in its nested
    # `inner` (torch >= 2.1), which holds `self` and `kwargs` as free variables.
    call = _require(torch.nn.Module, "_call_impl", "the module call")
    codes = [c for c in (call.__code__, *call.__code__.co_consts) if getattr(c, "co_name", None) in ("_call_impl", "inner")]
    runners = {c for c in codes if {"self", "kwargs"} <= {*c.co_varnames, *c.co_freevars}}
    if not runners:
        raise TorchIncompatibleError(
            f"torch {TORCH_VERSION}'s Module._call_impl no longer keeps the call's `kwargs` where its "
            "forward hooks run; install torch>=2.6,<=2.14.1 (the versions inplace-doctor is tested on)."
        )
    return frozenset(runners)


_FORWARD_HOOK_RUNNERS = _forward_hook_runners()


_CO_OPTIMIZED = 0x0001  # inspect.CO_OPTIMIZED: a function frame, whose locals live in fast slots


def frame_locals(frame: FrameType) -> dict[str, Any]:
    """`frame`'s local names, read without leaving a reference behind.

    On Python 3.11 and 3.12, reading `frame.f_locals` of a function frame fills
    a dict the frame keeps until it returns: it would hold the tensors the
    program later deletes or rebinds (and their graphs). A copy is returned and
    that dict emptied; whoever reads it next (`locals()`, a debugger, a trace
    call's trampoline) refills it first. Left as it is while a trace function
    runs in this thread (the trampoline writes the dict back after each call
    and refreshes it at each line anyway), for module and class bodies (the
    dict is their namespace) and from 3.13 (`f_locals` is a view, PEP 667).
    """
    names = frame.f_locals
    if sys.version_info >= (3, 13) or not frame.f_code.co_flags & _CO_OPTIMIZED or sys.gettrace() is not None:
        return names
    copy = dict(names)
    names.clear()
    return copy


def forward_call_kwargs(module: Any, hook_caller: Any) -> dict[str, Any]:
    """The keyword arguments of `module`'s call, read in a global forward pre-hook whose caller's frame
    is `hook_caller`: such hooks get `(module, args)` only (there is no `with_kwargs` for global
    pre-hooks), yet `model(**batch)` passes every tensor by keyword. {} when the frame is not the
    module call's."""
    if hook_caller is None or hook_caller.f_code not in _FORWARD_HOOK_RUNNERS:
        return {}
    names = hook_caller.f_locals
    kwargs = names.get("kwargs")
    return kwargs if names.get("self") is module and isinstance(kwargs, dict) else {}


RAW_SAVED_PREFIX = "_raw_saved_"

#: The innermost saved-tensor hooks pair, (pack, unpack) or None: inside a
#: non-reentrant checkpoint region it is the checkpoint's own.
top_saved_tensors_hooks: Callable[[bool], Any] = _require(
    _autograd, "_top_saved_tensors_default_hooks", "the saved-tensor hooks query"
)

#: Whether a tensor is a torch.func wrapper (a vmap BatchedTensor, a grad level's tensor).
is_functorch_wrapped: Callable[[Any], bool] = _require(
    torch._C._functorch, "is_functorch_wrapped_tensor", "the torch.func wrapper query"
)
#: Take the innermost saved-tensor hooks off the stack / put a pair on it (what
#: `torch.autograd.graph.saved_tensors_hooks` does on exit / enter).
pop_saved_tensors_hooks: Callable[[], None] = _require(
    _autograd, "_pop_saved_tensors_default_hooks", "the saved-tensor hooks stack"
)
push_saved_tensors_hooks: Callable[[Any, Any], None] = _require(
    _autograd, "_push_saved_tensors_default_hooks", "the saved-tensor hooks stack"
)
_require(torch.autograd.graph, "disable_saved_tensors_hooks", "torch.func's saved-tensor hooks switch")

import torch.utils.checkpoint as _checkpoint  # noqa: E402


def _closure_names(cls: Any, function: str) -> tuple[str, ...]:
    for const in _require(cls, "__init__", "checkpoint's hook classes").__code__.co_consts:
        if getattr(const, "co_name", None) == function:
            return tuple(const.co_freevars)
    return ()


# Non-reentrant checkpoint: `_checkpoint_hook(frame)` packs the region's saves in its forward,
# `_recomputation_hook(frame_ref, gid)` during its recompute; both mark their pack hook
# `_checkpoint_internal`. The region's `_CheckpointFrame` is read from the pack hook's closure.
_FORWARD_HOOK = _require(_checkpoint, "_checkpoint_hook", "non-reentrant checkpoint's forward hook")
_RECOMPUTE_HOOK = _require(_checkpoint, "_recomputation_hook", "non-reentrant checkpoint's recompute hook")
if "frame" not in _closure_names(_FORWARD_HOOK, "pack_hook") or not {"gid", "target_frame_ref"} <= set(
    _closure_names(_RECOMPUTE_HOOK, "pack_hook")
):
    raise TorchIncompatibleError(
        f"torch {TORCH_VERSION}'s torch.utils.checkpoint no longer keeps its frame in its pack hooks' "
        "closures; install torch>=2.6,<=2.14.1 (the versions inplace-doctor is tested on)."
    )


#: The classes whose `with` blocks are a non-reentrant region's forward and recompute.
CHECKPOINT_HOOK_CLASSES: tuple[type, ...] = (_FORWARD_HOOK, _RECOMPUTE_HOOK)


def _cell(function: Any, name: str) -> Any:
    code = function.__code__
    return function.__closure__[code.co_freevars.index(name)].cell_contents


def checkpoint_region(pack: Any) -> tuple[Any, Any] | None:
    """(checkpoint frame, None) in a non-reentrant region's forward, (frame, graph task id) in its
    recompute, for the innermost saved-tensor pack hook; None outside a region."""
    if not getattr(pack, "_checkpoint_internal", False):
        return None
    inner = getattr(pack, "__wrapped__", pack)  # the recompute's hook is wrapped by torch._dynamo.disable
    names = inner.__code__.co_freevars
    try:
        if "frame" in names:
            return _cell(inner, "frame"), None
        if "target_frame_ref" in names:
            frame = _cell(inner, "target_frame_ref")()
            return (frame, _cell(inner, "gid")) if frame is not None else None
    except (ValueError, AttributeError):  # an empty cell
        return None
    return None


def checkpoint_preserves_rng(frame: Any) -> bool | None:
    """The `preserve_rng_state` a non-reentrant region was run with, when its frame tells."""
    try:
        return bool(_cell(frame.recompute_fn, "preserve_rng_state"))
    except (ValueError, AttributeError, TypeError):
        return None


__all__ = [
    "TORCH_VERSION",
    "TorchDispatchMode",
    "TorchIncompatibleError",
    "current_autograd_node",
    "current_graph_task_id",
    "queue_backward_callback",
    "DisableTorchDispatch",
    "jit_tracing_state",
    "set_jit_tracing_state",
    "dispatch_mode_count",
    "pop_node_creation_hook",
    "push_node_creation_hook",
    "SavedTensor",
    "RAW_SAVED_PREFIX",
    "CHECKPOINT_HOOK_CLASSES",
    "checkpoint_preserves_rng",
    "checkpoint_region",
    "forward_call_kwargs",
    "top_saved_tensors_hooks",
    "pop_saved_tensors_hooks",
    "is_functorch_wrapped",
    "push_saved_tensors_hooks",
    "gather_traceback",
    "symbolize_tracebacks",
    "set_versions",
]


def remove_dispatch_mode(mode: Any) -> None:
    """Take `mode` out of this thread's dispatch-mode stack; the modes pushed above it are lifted
    off and put back in their order. Nothing happens to the stack when `mode` is not on it."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    above = []
    while (top := _get_current_dispatch_mode()) is not None and top is not mode:
        above.append(pop_dispatch_mode(None))
    if _get_current_dispatch_mode() is mode:
        pop_dispatch_mode(None)
    for lifted in reversed(above):
        push_dispatch_mode(lifted)
