"""The watched window both training callbacks share: one `ipd.watch()` over the first N steps.

A framework callback calls `open(model)` where a training step starts (before its
forward), `close()` once N optimizer steps have finished (after the step and the
`zero_grad` that follows it), and `verdict()` after that. While the window is open,
`guard(owner, names)` wraps the framework's own methods that run the user's forward,
backward and optimizer step: an exception raised inside them closes the window with that
exception, so PyTorch's in-place error leaves the fit as `ipd.InplaceError` naming both
lines, and no tracer stays installed when the fit fails (the frameworks re-raise after
their callbacks ran, and only Lightning tells callbacks at all). `abandon(exc)` does the same
for an exception met elsewhere (the Hugging Face callback wraps `Trainer.train` for that).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from ..api import InplaceDoctorError, Report, Severity, UsageError, watch
from ..trace.raised.blame import call_through

Selection = Iterable[str] | str | None


class InplaceHazardsFound(InplaceDoctorError, RuntimeError):
    """Findings at or above `fail_on` were found while a training callback watched; the message is
    the text report, `.report` the `Report` (raised after the window closed, so training itself ran
    as without the callback). A `RuntimeError` too, like the in-place errors PyTorch raises."""

    def __init__(self, message: str, report: Report) -> None:
        super().__init__(message)
        self.report = report


def parse_fail_on(fail_on: str | Severity | None) -> Severity | None:
    """`"error"`, `"warning"`, `"info"`, a `Severity`, or None (report only)."""
    if fail_on is None or isinstance(fail_on, Severity):
        return fail_on
    try:
        return Severity(str(fail_on).lower())
    except ValueError:
        choices = ", ".join(s.value for s in Severity)
        raise UsageError(f"fail_on must be one of {choices} or None, got {fail_on!r}") from None


class StepWindow:
    """One watch over the first `steps` training steps; opened once, closed once."""

    def __init__(
        self, steps: int, fail_on: str | Severity | None, select: Selection, ignore: Selection, stack: int,
        deep: bool | None = None,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UsageError(f"steps must be a positive int (training steps to watch), got {steps!r}")
        self.steps = steps
        self.fail_on = parse_fail_on(fail_on)
        self._select, self._ignore, self._stack, self._deep = select, ignore, stack, deep
        self._session: watch | None = None
        self._restore: list[Callable[[], None]] = []
        self.started = False
        self.report: Report | None = None
        self.target = ""
        self.on_error_close: Callable[[], object] | None = None  # told after an exception closed the window

    @property
    def is_open(self) -> bool:
        return self._session is not None

    def open(self, model: Any, target: str) -> None:
        """Start watching (once): `model`'s submodules are named `model.<path>` in findings."""
        if self.started:
            return
        self.started = True
        self.target = target
        models = (model,) if model is not None else ()
        session = watch(*models, select=self._select, ignore=self._ignore, stack=self._stack, deep=self._deep)
        session.__enter__()
        self._session = session

    def guard(self, owner: Any, names: Iterable[str]) -> None:
        """Wrap `owner.<name>` for each name (on the instance, undone at close) so an exception
        inside it closes the window with that exception first."""
        for name in names:
            original = getattr(owner, name, None)
            if original is None or not callable(original):
                continue
            had_own = name in getattr(owner, "__dict__", {})
            setattr(owner, name, self._guarded(original))
            self._restore.append(functools.partial(_restore, owner, name, original if had_own else None))

    def _guarded(self, original: Callable[..., Any]) -> Callable[..., Any]:
        window = self

        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return call_through(original, args, kwargs)  # the user's step: its errors are its own
            except Exception as exc:
                window.abandon(exc)
                raise

        return guarded

    def abandon(self, exc: BaseException) -> None:
        """Close the window, if still open, with the exception that stops the fit, then tell
        `on_error_close`; raises what `close` raises for it (an `InplaceError` from `exc`)."""
        if not self.is_open:
            return
        try:
            self.close(exc)
        finally:
            if self.on_error_close is not None:
                self.on_error_close()

    def close(self, exc: BaseException | None = None) -> Report | None:
        """Stop watching (passing on the exception that stopped the step, if any) and keep the
        report; raises what `watch.__exit__` raises for `exc` (an `InplaceError` naming both lines)."""
        session = self._session
        if session is None:
            return self.report
        self._session = None
        for undo in reversed(self._restore):
            undo()
        self._restore = []
        try:
            session.__exit__(type(exc) if exc is not None else None, exc, exc.__traceback__ if exc else None)
        finally:
            report = session.report()
            report.target = self.target
            self.report = report
        return report

    def summary(self, watched: int) -> str:
        """One line: what was watched and what was found."""
        report = self.report
        assert report is not None
        found = [f"{report.count(s)} {s.value}" for s in Severity if report.count(s)]
        what = f"{len(report.findings)} finding(s): {', '.join(found)}" if found else "no finding"
        return f"inplace-doctor watched {watched} training step(s) of {self.target}: {what}"

    def announcement(self, watched: int) -> str:
        """What a callback prints once the window closed: the summary line, and the text report
        below it when something was found (a clean run prints that one line, in both frameworks)."""
        report = self.report
        assert report is not None
        line = self.summary(watched)
        return f"{line}\n{report}" if report.findings else line

    def metrics(self) -> dict[str, float]:
        """Counts by severity, under `inplace_doctor/`, for a framework's logger."""
        report = self.report
        assert report is not None
        counts = {f"inplace_doctor/{s.value}s": float(report.count(s)) for s in Severity}
        return {"inplace_doctor/findings": float(len(report.findings)), **counts}

    def verdict(self, watched: int) -> None:
        """Raise `InplaceHazardsFound` when the report has a finding at or above `fail_on`."""
        report = self.report
        if report is None or self.fail_on is None or not report.failed(self.fail_on):
            return
        raise InplaceHazardsFound(
            f"{self.summary(watched)} (fail_on={self.fail_on.value}); the fit is stopped:\n{report}", report
        )


def _restore(owner: Any, name: str, own: Any) -> None:
    if own is not None:
        setattr(owner, name, own)
    else:
        try:
            delattr(owner, name)  # back to the class's method
        except AttributeError:
            pass
