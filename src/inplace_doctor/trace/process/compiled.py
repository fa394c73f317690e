"""`torch.compile`d code runs eagerly while the tracer runs, and is counted so the report can say so.

A compiled graph runs fused kernels the dispatch mode never sees op by op, and
the compiler's meaning is the eager program's: so while any tracer runs, the
compiler's stance is `force_eager` (`torch.compiler.set_stance`, process-wide:
set by the first tracer in, the stance before it put back by the last out,
after which compiled code compiles as usual). Two more changes share that
lifetime (`shared_patches.py`: sessions of two threads may end in any order):
a counter around dynamo's per-call stance lookup (how many compiled calls each
tracer's thread ran eagerly), and a warning filter for the one warning our
global module hooks would make `OptimizedModule.__call__` print on every call.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .shared_patches import Shared, SharedGroup, SharedPatch

# What `OptimizedModule.__call__` warns when any global module hook is installed (ours are, while tracing).
_GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def _eval_frame() -> Any:
    """torch._dynamo.eval_frame, if this torch has it and it exposes the stance lookup we count."""
    try:
        from torch._dynamo import eval_frame
    except Exception:  # a platform without dynamo: nothing can be compiled there either
        return None
    return eval_frame if callable(getattr(eval_frame, "_callback_from_stance", None)) else None


class _Stance:
    """`force_eager` and the warning filter, while at least one `EagerCompiled` is in."""

    def __init__(self) -> None:
        self.stance: Any = None
        self.warning_filter: Any = None

    def install(self) -> None:
        # One filter added and exactly that one removed (not `catch_warnings`, whose exit would
        # also drop every filter the user's code added meanwhile).
        warnings.filterwarnings("ignore", message=_GLOBAL_HOOK_WARNING, category=UserWarning)
        self.warning_filter = warnings.filters[0]
        stance = torch.compiler.set_stance("force_eager")
        stance.__enter__()
        self.stance = stance

    def uninstall(self) -> None:
        if self.stance is not None:
            self.stance.__exit__(None, None, None)
            self.stance = None
        if self.warning_filter is not None:
            try:
                warnings.filters.remove(self.warning_filter)  # type: ignore[attr-defined]  # a list at run time
            except ValueError:  # the user's code reset the filters meanwhile
                pass
            mutated = getattr(warnings, "_filters_mutated", None)
            if mutated is not None:
                mutated()  # as `filterwarnings` does: the per-module "already warned" caches are stale
            self.warning_filter = None


_STANCE = _Stance()
_EAGER: Shared[EagerCompiled] = Shared(_STANCE.install, _STANCE.uninstall)


def _counting(original: Any, patch: SharedPatch[EagerCompiled]) -> Any:
    def counted(callback: Any) -> Any:
        # Called once per entry into a compiled function or module (its compile wrapper), on its thread.
        if callback not in (None, False):
            for compiled in patch.here():
                compiled.calls += 1
        return original(callback)

    counted.__wrapped__ = original  # type: ignore[attr-defined]
    return counted


_COUNTED: SharedPatch[EagerCompiled] | None = None


def _counted() -> SharedPatch[EagerCompiled] | None:
    global _COUNTED
    if _COUNTED is None:
        eval_frame = _eval_frame()
        if eval_frame is not None:
            patch: SharedPatch[EagerCompiled] = SharedPatch(
                eval_frame, "_callback_from_stance", lambda original: _counting(original, patch)
            )
            _COUNTED = patch
    return _COUNTED


_GROUP: list[Shared[EagerCompiled]] = []


def _shared() -> Shared[EagerCompiled]:
    """The counter and the stance, made and undone together (`SharedGroup`), built at first use."""
    if not _GROUP:
        counted = _counted()
        _GROUP.append(SharedGroup([counted, _EAGER]) if counted is not None else _EAGER)
    return _GROUP[0]


class EagerCompiled:
    """Context manager: compiled functions and modules run eagerly inside; `calls` counts this thread's."""

    def __init__(self) -> None:
        self.calls = 0
        self._in: list[Shared[EagerCompiled]] = []

    def __enter__(self) -> EagerCompiled:
        if getattr(getattr(torch, "compiler", None), "set_stance", None) is None:
            return self  # a torch before 2.6: compiled code is refused where it is met
        shared = _shared()
        shared.acquire(self)
        self._in.append(shared)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._in:
            self._in.pop().release(self)

    def note(self) -> str | None:
        """The report's line about compiled code, if any ran eagerly."""
        if not self.calls:
            return None
        n = self.calls
        return (
            f"{n} call{'s' if n != 1 else ''} into torch.compile'd code ran eagerly while traced (the eager program is "
            "what the compiler preserves, and its ops are what in-place hazards are found in); outside the traced "
            "window they compile as usual"
        )


COMPILED_WRAPPER = "_orig_mod"  # what `torch.compile(module)` calls the module it wraps


def uncompiled(module: torch.nn.Module) -> torch.nn.Module:
    """The eager module inside a `torch.compile(module)` wrapper (`OptimizedModule._orig_mod`), else itself."""
    if type(module).__name__ == "OptimizedModule":
        inner = module.__dict__.get("_modules", {}).get(COMPILED_WRAPPER)
        if inner is not None:
            return inner  # type: ignore[no-any-return]
    return module


def without_compiled_wrappers(name: str) -> str:
    """`_orig_mod.fc` -> `fc`, `block._orig_mod.0` -> `block.0`: a compiled module is named as the
    module it wraps, as the user wrote the model."""
    if COMPILED_WRAPPER not in name:
        return name
    return ".".join(part for part in name.split(".") if part != COMPILED_WRAPPER)
