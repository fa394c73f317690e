"""Every private PyTorch API inplace-doctor relies on, checked once at import.

If a PyTorch release renames one of these, the tool fails here with a message
naming the torch version, instead of misbehaving deep inside a user's run.
"""

from __future__ import annotations

from typing import Any, Callable

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
#: The saved-tensor object behind `node._raw_saved_<field>`; `.data` is what the
#: pack hook returned, read without unpacking (so no checkpoint recompute).
SavedTensor: Any = _require(_autograd, "SavedTensor", "autograd's SavedTensor type")

_require(SavedTensor, "data", "SavedTensor.data")
_require(SavedTensor, "unpack_hook", "SavedTensor.unpack_hook")

#: Context manager: ops inside skip every Python dispatch mode (the tool's own
#: bookkeeping ops must not be recorded, and re-entering the mode is costly).
DisableTorchDispatch: Any = _require(torch._C, "_DisableTorchDispatch", "the dispatch-mode guard")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

#: Captures the current Python stack in C (code objects and instruction
#: offsets, no frame objects, so no locals kept alive); `symbolize_tracebacks`
#: turns captures into file/line/name only when a finding needs them.
gather_traceback: Callable[..., Any] = _require(torch._C._profiler, "gather_traceback", "the C stack capture")
symbolize_tracebacks: Callable[[list[Any]], list[list[dict[str, Any]]]] = _require(
    torch._C._profiler, "symbolize_tracebacks", "the C stack capture's symbolizer"
)

_require(torch.autograd.graph, "saved_tensors_hooks", "saved-tensor hooks")
_require(torch.nn.modules.module, "register_module_forward_pre_hook", "global module hooks")
_require(torch.nn.modules.module, "register_module_forward_hook", "global module hooks")

RAW_SAVED_PREFIX = "_raw_saved_"

__all__ = [
    "TORCH_VERSION",
    "TorchDispatchMode",
    "TorchIncompatibleError",
    "current_autograd_node",
    "DisableTorchDispatch",
    "pop_node_creation_hook",
    "push_node_creation_hook",
    "SavedTensor",
    "RAW_SAVED_PREFIX",
    "gather_traceback",
    "symbolize_tracebacks",
]
