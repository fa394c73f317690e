"""The traceback of a script run by `inplace-doctor run`, or of a model, factory or module that
raised under the other commands, printed as python would print it: without the tool's own frames
(nor runpy's and importlib's) and exceptions, and with PyTorch's error where the tool replaced it."""

from __future__ import annotations

import os
import traceback
from typing import TextIO

from ...errors import InplaceError
from ...printing import encodable

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the package, not cli/
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples")


def print_script_error(exc: BaseException, err: TextIO) -> None:
    """Print the traceback python would have printed for `exc`, without the tool.

    The tool's frames (this runner, runpy, the tracer's hooks and modes) are
    left out, and so are exceptions the tool chained on; where the tool
    replaced PyTorch's error with `InplaceError`, PyTorch's error is shown.
    """
    shown, frames_of = exc, exc
    if isinstance(exc, InplaceError) and isinstance(exc.__cause__, BaseException):
        shown = exc.__cause__
        frames_of = shown if shown.__traceback__ is not None else exc
    report = traceback.TracebackException(type(shown), shown, frames_of.__traceback__, compact=True)
    _trim(report)
    err.flush()
    print(encodable("".join(report.format()), err), end="", file=err)
    err.flush()


def _trim(report: traceback.TracebackException) -> None:
    seen: set[int] = set()
    pending: list[traceback.TracebackException] = [report]
    while pending:
        te = pending.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list(_user_frames(list(te.stack)))
        for attr in ("__cause__", "__context__"):
            chained = getattr(te, attr)
            if chained is None:
                continue
            if _is_tool_exception(chained):
                setattr(te, attr, None)
            else:
                pending.append(chained)


def _is_tool_exception(te: traceback.TracebackException) -> bool:
    """The tool's own exceptions, except `WrittenHere`: where the write ran is the diagnosis, kept."""
    module = getattr(te, "exc_type_module", None)
    name = getattr(te, "exc_type_qualname", None)
    if module is None:  # Python < 3.13
        exc_type = getattr(te, "exc_type", None)
        module = getattr(exc_type, "__module__", "")
        name = getattr(exc_type, "__qualname__", "")
    return str(module).startswith("inplace_doctor.") and name != "WrittenHere"


# The import system's own frames: python hides them from an `import` statement's traceback, and the
# tool's `importlib.import_module` of a model spec's module shows them.
_IMPORT_FRAMES = ("<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_IMPORTLIB_INIT = os.path.join("importlib", "__init__.py")


def _is_tool_frame(frame: traceback.FrameSummary) -> bool:
    filename = os.path.abspath(frame.filename) if not frame.filename.startswith("<") else frame.filename
    if filename in _IMPORT_FRAMES or os.path.basename(filename) == "runpy.py" or filename.endswith(_IMPORTLIB_INIT):
        return True
    return filename.startswith(_PACKAGE_DIR + os.sep) and not filename.startswith(_EXAMPLES_DIR + os.sep)


# PyTorch's frames that call into the tool's modes and hooks; python without the tool shows none of them.
_DISPATCH_FILES = tuple(
    os.path.join("torch", *parts) for parts in (("overrides.py",), ("_dynamo", "eval_frame.py"), ("utils", "_python_dispatch.py"))
)


def _user_frames(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The frames python would have shown: without the tool's, nor PyTorch's calls into the tool's
    modes (`handle_torch_function` dispatching to our function mode, dynamo's `disable` wrapper,
    `_ops.py` called by our dispatch mode)."""
    keep = [not _is_tool_frame(f) for f in frames]
    for i in range(len(frames)):
        if keep[i]:
            continue
        j = i - 1
        while j >= 0 and keep[j] and frames[j].filename.endswith(_DISPATCH_FILES):
            keep[j] = False
            j -= 1
        if j < i - 1 and j >= 0 and keep[j] and "handle_torch_function" in (frames[j].line or ""):
            keep[j] = False  # the torch function that dispatched only because our mode is on
        j = i + 1
        while j < len(frames) and frames[j].filename.endswith(os.path.join("torch", "_ops.py")):
            keep[j] = False  # the op our dispatch mode ran for the script's own call
            j += 1
    return [f for f, k in zip(frames, keep) if k]
