"""Whose exception is it: the user's program (or PyTorch at the user's call), or the tool's own crash.

The tool runs inside the user's program (modes, hooks) and runs the user's
program (a model call, `backward()`); an exception crosses both. The rule: the
innermost frame outside torch and the standard library decides. A frame of the
user's code means the user's; a frame of the tool's means the tool's, except
where the tool only passed a call on (its dispatch mode running the user's op,
an engine calling the model): there `passed_through` records, as the exception
crosses, that the error came from below, before an outer frame of the tool can
look like its origin.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

from .._version import __version__
from ..errors import InplaceDoctorError, InternalError
from .stacks import PACKAGE_DIR, TORCH_DIR

_VERDICT = "_inplace_doctor_raised_by_tool"
_TOOL_DIR = os.path.join(PACKAGE_DIR, "")
_EXAMPLES_DIR = os.path.join(PACKAGE_DIR, "examples", "")
_STDLIB_DIR = os.path.join(os.path.dirname(os.__file__), "")


def _innermost_deciding_file(tb: TracebackType | None) -> str | None:
    """The file of the innermost frame of `tb` outside torch and the standard library."""
    found = None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        stdlib = filename.startswith(_STDLIB_DIR) and "-packages" + os.sep not in filename
        if not (filename.startswith(TORCH_DIR) or stdlib or filename.startswith("<frozen")):
            found = filename
        tb = tb.tb_next
    return found


def _is_tool_file(filename: str | None) -> bool:
    return filename is not None and filename.startswith(_TOOL_DIR) and not filename.startswith(_EXAMPLES_DIR)


def passed_through(exc: BaseException) -> None:
    """Call in the `except` around the tool's call of the user's code or op: records, once,
    whether `exc` came from below that call (the user's, or PyTorch's at it) or from a hook
    or mode of the tool that ran inside it. The handler's own frame is left out."""
    if not isinstance(exc, Exception) or isinstance(exc, InplaceDoctorError) or hasattr(exc, _VERDICT):
        return
    tb = exc.__traceback__
    below = tb.tb_next if tb is not None else None
    try:
        setattr(exc, _VERDICT, _is_tool_file(_innermost_deciding_file(below)))
    except (AttributeError, TypeError):  # an exception type without a __dict__: decided at the top
        pass


def the_programs_error(exc: BaseException) -> None:
    """Mark an exception the tool raises on the program's behalf (PyTorch's check, which the
    tool's hooks switched off and perform instead) as the program's, not the tool's crash."""
    setattr(exc, _VERDICT, False)


def call_through(func: Any, args: Any, kwargs: Any) -> Any:
    """`func(*args, **kwargs)` for a mode or hook of the tool passing the user's call on."""
    try:
        return func(*args, **kwargs)
    except BaseException as exc:
        passed_through(exc)
        raise


def raised_by_the_tool(exc: BaseException) -> bool:
    """Whether `exc` is a crash of the tool's own code, not the user's program's exception."""
    if not isinstance(exc, Exception) or isinstance(exc, InplaceDoctorError):
        return False
    verdict = getattr(exc, _VERDICT, None)
    if verdict is not None:
        return bool(verdict)
    return _is_tool_file(_innermost_deciding_file(exc.__traceback__))


def internal_error(exc: BaseException) -> InternalError:
    """The error that says the tool crashed (chain it: `raise internal_error(e) from e`)."""
    import torch

    import textwrap

    text = str(exc).strip()
    first = textwrap.shorten(text.splitlines()[0], 300, placeholder=" ...") if text else ""
    python = ".".join(map(str, sys.version_info[:3]))
    return InternalError(
        f"inplace-doctor failed: {type(exc).__name__}" + (f": {first}" if first else "")
        + f" (a bug in inplace-doctor {__version__}, torch {torch.__version__}, Python {python}; not in "
        "your code: please report it with the traceback above)"
    )
