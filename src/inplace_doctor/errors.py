"""The exceptions inplace-doctor raises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .findings import Finding


class InplaceDoctorError(Exception):
    """Base class of inplace-doctor's own errors."""


class UsageError(InplaceDoctorError, ValueError):
    """Bad input from the user: one clear line says what and the closest valid choice."""


class InplaceError(RuntimeError):
    """An in-place operation broke autograd; the message names both culprits.

    Carries `.findings`; the PyTorch error it replaces is chained as `__cause__`.
    """

    def __init__(self, message: str, findings: "Sequence[Finding]" = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


class WrittenHere(Exception):
    """Chained in front of an in-place error raised at backward: where the write ran.

    Its message is the write's user stack, formatted as a traceback (the frames
    themselves are not kept: they would keep the graph alive until backward).
    """


class ModelError(InplaceDoctorError, RuntimeError):
    """The user's model raised; the message says how far the tool got."""
