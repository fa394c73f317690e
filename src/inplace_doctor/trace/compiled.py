"""`torch.compile`d code runs eagerly while the tracer runs, and is counted so the report can say so.

A compiled graph runs fused kernels the dispatch mode never sees op by op, and
the compiler's meaning is the eager program's: so for the traced window the
compiler's stance is `force_eager` (`torch.compiler.set_stance`, restored on
exit, after which compiled code compiles as usual). Two things are undone on
exit too: a counter around dynamo's per-call stance lookup (how many compiled
calls ran eagerly), and a warning filter for the one warning our global module
hooks would make `OptimizedModule.__call__` print on every call.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

# What `OptimizedModule.__call__` warns when any global module hook is installed (ours are, while tracing).
_GLOBAL_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def _eval_frame() -> Any:
    """torch._dynamo.eval_frame, if this torch has it and it exposes the stance lookup we count."""
    try:
        from torch._dynamo import eval_frame
    except Exception:  # a platform without dynamo: nothing can be compiled there either
        return None
    return eval_frame if callable(getattr(eval_frame, "_callback_from_stance", None)) else None


class EagerCompiled:
    """Context manager: compiled functions and modules run eagerly inside; `calls` counts them."""

    def __init__(self) -> None:
        self.calls = 0
        self._stance: Any = None
        self._patched: Any = None
        self._warning_filter: Any = None

    def __enter__(self) -> "EagerCompiled":
        compiler = getattr(torch, "compiler", None)
        set_stance = getattr(compiler, "set_stance", None)
        if set_stance is None:  # a torch before 2.6: compiled code is refused where it is met
            return self
        eval_frame = _eval_frame()
        if eval_frame is not None:
            original = eval_frame._callback_from_stance

            def counted(callback: Any) -> Any:
                # Called once per entry into a compiled function or module (its compile wrapper).
                if callback not in (None, False):
                    self.calls += 1
                return original(callback)

            counted.__wrapped__ = original  # type: ignore[attr-defined]
            eval_frame._callback_from_stance = counted
            self._patched = (eval_frame, original)
        # One filter added and exactly that one removed on exit (not `catch_warnings`, whose exit would
        # also drop every filter the user's code added meanwhile).
        warnings.filterwarnings("ignore", message=_GLOBAL_HOOK_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
        self._stance = set_stance("force_eager")
        self._stance.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None
        if self._warning_filter is not None:
            try:
                warnings.filters.remove(self._warning_filter)  # type: ignore[attr-defined]  # a list at run time
            except ValueError:  # the user's code reset the filters meanwhile
                pass
            mutated = getattr(warnings, "_filters_mutated", None)
            if mutated is not None:
                mutated()  # as `filterwarnings` does: the per-module "already warned" caches are stale
            self._warning_filter = None
        if self._patched is not None:
            eval_frame, original = self._patched
            eval_frame._callback_from_stance = original
            self._patched = None

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
