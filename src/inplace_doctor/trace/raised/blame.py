"""Whose exception is it: the user's program (or PyTorch at the user's call), or the tool's own crash.

The tool runs inside the user's program (modes, hooks) and runs the user's
program (a model call, `backward()`); an exception crosses both. The rule: the
innermost frame outside torch and the standard library decides. A frame of the
user's code means the user's; a frame of the tool's means the tool's, except
where the tool only passed a call on (its dispatch mode running the user's op,
an engine calling the model): there `passed_through` records, as the exception
crosses, that the error came from below, before an outer frame of the tool can
look like its origin.

A compile error (`SyntaxError`, a bad source encoding) belongs to the file it
names: the user's script or module, whichever of the tool's frames compiled it.

The tool's frames also take room on the stack the user's program would have
had: `recursion_headroom` gives it back while the tool runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from ..._version import __version__
from ...errors import InplaceDoctorError, InternalError
from ..places.stacks import PACKAGE_DIR, TORCH_DIR

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
    if isinstance(exc, SyntaxError) and _names_a_file_of_the_user(exc.filename):
        return False  # runpy or importlib, called by the tool, compiled the user's file
    return _is_tool_file(_innermost_deciding_file(exc.__traceback__))


def _names_a_file_of_the_user(filename: Any) -> bool:
    if not isinstance(filename, str) or not os.path.isfile(filename):
        return False  # "<unknown>": source text the tool itself compiled
    return not _is_tool_file(os.path.abspath(filename))


UNPRINTABLE = "<exception str() failed>"  # what Python's traceback prints for it


def printable_text(exc: BaseException) -> str | None:
    """`str(exc)`, stripped, or None when the exception's `__str__` itself raises: a user's
    exception class must not turn its error into the tool's crash. (PyTorch's errors all print.)"""
    try:
        return str(exc).strip()
    except Exception:
        return None


def exception_text(exc: BaseException) -> str:
    """`printable_text(exc)` to show: `UNPRINTABLE` in place of an exception that cannot print."""
    text = printable_text(exc)
    return UNPRINTABLE if text is None else text


# How many more frames the user's program needs under the tool than without it, measured
# (tests/cli/test_user_errors.py holds a model to each): with the tracer's global module hooks on,
# torch's `Module._call_impl` takes its slow path, which calls forward through one more frame
# (`inner`): a module nested in a module costs 4 frames instead of 3, a third more, and 5 where its
# class defines `forward` (the entry wrapper, `entry_points.py`): two thirds more. `copy.deepcopy`
# (verify, memory, optimize copy the model) takes 6 frames a nesting level where forward takes 3.
# On top, the tool's own frames below the model's call (the command line, the engine, runpy under
# `run`) and above its ops (the dispatch and function modes, the hooks): 11 (audit, run) to 24
# (optimize) measured on a forward recursing in plain Python; 100 given.
_TOOL_FRAMES = 100
#: one entry per headroom on, in the order they began: [the user's own limit, the limit to put back]
_headrooms: list[list[int]] = []
_headroom_lock = threading.Lock()
os.register_at_fork(after_in_child=_headroom_lock._at_fork_reinit)  # type: ignore[attr-defined]


@contextlib.contextmanager
def recursion_headroom(*, copying: bool = False) -> Iterator[None]:
    """Raise the recursion limit, while the tool runs the user's program, by the frames the tool
    adds (with `copying`, what deep-copying the model needs); restored after, unless the program
    set a limit of its own meanwhile. Nested uses scale the user's limit, not each other's.

    The limit is process-wide, and sessions of several threads may end in any order: one that ends
    under another's headroom leaves the limit alone and hands what it would have put back to the
    one above it. The limit is never lowered while another session runs (a lowered limit under a
    thread's `ast.parse` makes CPython raise "AST constructor recursion depth mismatch")."""
    with _headroom_lock:
        before = sys.getrecursionlimit()
        user = _headrooms[-1][0] if _headrooms else before
        wanted = max(before, (2 * user if copying else user + 2 * user // 3) + _TOOL_FRAMES)
        entry = [user, before]
        _headrooms.append(entry)
        if wanted != before:
            sys.setrecursionlimit(wanted)
    try:
        yield
    finally:
        with _headroom_lock:
            at = next(i for i, e in enumerate(_headrooms) if e is entry)
            del _headrooms[at]
            if at < len(_headrooms):  # another began after this one and runs on: it puts back ours
                _headrooms[at][1] = entry[1]
            elif sys.getrecursionlimit() == wanted and entry[1] != wanted:
                sys.setrecursionlimit(entry[1])


def internal_error(exc: BaseException) -> InternalError:
    """The error that says the tool crashed (chain it: `raise internal_error(e) from e`)."""
    import textwrap

    import torch

    text = exception_text(exc)
    first = textwrap.shorten(text.splitlines()[0], 300, placeholder=" ...") if text else ""
    python = ".".join(map(str, sys.version_info[:3]))
    return InternalError(
        f"inplace-doctor failed: {type(exc).__name__}" + (f": {first}" if first else "")
        + f" (a bug in inplace-doctor {__version__}, torch {torch.__version__}, Python {python}; not in "
        "your code: please report it with the traceback above)"
    )


def forget_frames(exc: BaseException | None) -> None:
    """Drop the tracebacks of an error the tool consumed: autograd may keep the error
    object after backward returns, and its frames would keep the graph alive."""
    while exc is not None:
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
