"""The exceptions inplace-doctor raises: all under `InplaceDoctorError`, each also the builtin it refines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class InplaceDoctorError(Exception):
    """Base class of inplace-doctor's own errors."""


class UsageError(InplaceDoctorError, ValueError):
    """Bad input from the user: one clear line says what and the closest valid choice."""


class InplaceError(InplaceDoctorError, RuntimeError):
    """An in-place operation broke autograd; the message names both culprits.

    Carries `.findings` (the `Finding`s behind it); the PyTorch error it replaces is chained as
    `__cause__`. A `RuntimeError` too, so code that catches PyTorch's error catches this one.
    """

    #: raised by a backward at a changed saved tensor it reached: the predictions pending in that
    #: backward's graph are the ones it stopped before (the analyzer marked them there)
    in_backward = False

    def __init__(self, message: str, findings: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


_TOOL_ERROR = "_inplace_doctor_error"


def carry_tool_error(exc: BaseException, error: InplaceError) -> None:
    """`exc`, PyTorch's error as the program sees it (its type and message unchanged), carries the
    tool's `error`: a watch it leaves raises `error` from it (`tool_error_of`)."""
    setattr(exc, _TOOL_ERROR, error)


def tool_error_of(exc: BaseException | None) -> InplaceError | None:
    """The `InplaceError` the tool made for `exc` (see `carry_tool_error`), or `exc` itself when it is one."""
    if isinstance(exc, InplaceError):
        return exc
    error = getattr(exc, _TOOL_ERROR, None) if exc is not None else None
    return error if isinstance(error, InplaceError) else None


def taken_from_program(exc: BaseException) -> InplaceError | None:
    """The `InplaceError` `exc` carries, now that it left the program's code: where the write ran is
    chained in front of `exc` (printed first: where the write ran, then PyTorch's error, then ours)."""
    error = tool_error_of(exc)
    if error is None or error is exc:
        return error
    written = getattr(error, "written_here", None)
    if isinstance(written, BaseException) and exc.__cause__ is None:
        exc.__cause__ = written
    return error


def raise_tool_error(exc: BaseException) -> None:
    """Raise the `InplaceError` `exc` carries (`taken_from_program`), from `exc`; nothing if none."""
    error = taken_from_program(exc)
    if error is not None and error is not exc:  # its traceback is PyTorch's error's: the backward line
        raise error.with_traceback(exc.__traceback__) from exc


class WrittenHere(InplaceDoctorError):
    """Chained in front of an in-place error raised at backward: where the write ran.

    Its message is the write's user stack, formatted as a traceback (the frames
    themselves are not kept: they would keep the graph alive until backward).
    """


class ModelError(InplaceDoctorError, RuntimeError):
    """The user's model raised; the message says how far the tool got."""


class UnsupportedModuleError(InplaceDoctorError, TypeError):
    """A model the tracer cannot see into (TorchScript, a compiled graph): the message says what to pass instead."""


class TorchIncompatibleError(InplaceDoctorError, ImportError):
    """The installed torch lacks an API the tracer needs; the message names the version."""


class InternalError(InplaceDoctorError, RuntimeError):
    """inplace-doctor itself crashed (not the user's code): the message names the versions and asks
    for a report; the crash is chained as `__cause__`. The command line exits 4."""
