"""pytest plugin: the `inplace_audit` fixture and the `@pytest.mark.inplace_audit` marker.

    def test_model(inplace_audit):
        inplace_audit(MyModel(), torch.randn(2, 3, 64, 64))   # fails the test on a hazard

    @pytest.mark.inplace_audit(ignore=["IPD103"])
    def test_training_step():
        train_one_step()                                       # the body runs under ipd.watch()

The fixture audits one model call (`ipd.audit`); the marker watches everything
the test body runs (`ipd.watch`), fixtures excluded. Both fail the test with
the text report when a finding at or above `fail_on` exists (default
"warning", or `--inplace-doctor-fail-on`). The report names the test's lines
as the callers, never this plugin's.

An error the test expects is its subject, not a finding against it: under the
marker, the findings of an in-place error that `pytest.raises` caught (`with
pytest.raises(RuntimeError, match=...)`; the call form too from pytest 8.4,
where it runs the same context manager) do not count, and the report's note
names them. Everything else still fails the test:
another finding, the overwritten tensors the backward stopped before reaching
(each its own hazard), an error `pytest.raises` did not match (`match=` failed),
and an error caught any other way (an `except` in the test, or in the code
under test, which would hide the bug).

At import this module needs only pytest: inplace_doctor's modules (and torch)
are imported, by absolute name, when a test uses the fixture or the marker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    import torch

    from inplace_doctor.api import watch
    from inplace_doctor.findings import Severity
    from inplace_doctor.report import Report

MARKER = "inplace_audit"
SEVERITIES = ("error", "warning", "info")
_OPTION = "inplace_doctor_fail_on"
_MARKER_KWARGS = frozenset({"select", "ignore", "fail_on"})
_EXPECTED_NOTE = "expected by pytest.raises, so not counted"


class InplaceAudit(Protocol):
    """The type of the `inplace_audit` fixture (for annotating tests)."""

    def __call__(
        self,
        model: torch.nn.Module,
        *args: Any,
        select: Iterable[str] | str | None = None,
        ignore: Iterable[str] | str | None = None,
        fail_on: str | Severity | None = None,
        **kwargs: Any,
    ) -> Report: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("inplace-doctor")
    group.addoption(
        "--inplace-doctor-fail-on",
        dest=_OPTION,
        choices=SEVERITIES,
        default=None,
        help="lowest finding severity that fails a test using the inplace_audit fixture or marker "
        "when the test does not say (default: warning)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(select=None, ignore=None, fail_on=None): run the test body under "
        "inplace_doctor.watch() and fail the test on in-place hazards at or above fail_on "
        "(default: --inplace-doctor-fail-on, else warning)",
    )


def _default_fail_on(config: pytest.Config) -> str:
    value = config.getoption(_OPTION, default=None)
    return value if isinstance(value, str) else "warning"


def _severity(fail_on: str | Severity) -> Severity:
    from inplace_doctor.errors import UsageError
    from inplace_doctor.findings import Severity

    if isinstance(fail_on, Severity):
        return fail_on
    try:
        return Severity(str(fail_on).lower())
    except ValueError:
        raise UsageError(f"fail_on must be one of {', '.join(SEVERITIES)}, got {fail_on!r}") from None


def _failure(report: Report, fail_on: Severity, intro: str) -> str:
    return f"{intro} (fail_on={fail_on.value}):\n{report}"


@pytest.fixture
def inplace_audit(request: pytest.FixtureRequest) -> InplaceAudit:
    """`inplace_audit(model, *args, select=None, ignore=None, fail_on=None, **kwargs) -> Report`.

    Audits `model(*args, **kwargs)` (forward and backward, `ipd.audit`; `loss_fn=`
    and `backward=` are passed on) and fails the test with the text report when
    a finding at or above `fail_on` exists; returns the Report otherwise.
    """
    default = _default_fail_on(request.config)

    def run(
        model: torch.nn.Module,
        *args: Any,
        select: Iterable[str] | str | None = None,
        ignore: Iterable[str] | str | None = None,
        fail_on: str | Severity | None = None,
        **kwargs: Any,
    ) -> Report:
        __tracebackhide__ = True
        from inplace_doctor.engines.audit import audit

        threshold = _severity(fail_on if fail_on is not None else default)
        report = audit(model, *args, select=select, ignore=ignore, **kwargs)
        if report.failed(threshold):
            pytest.fail(_failure(report, threshold, "in-place hazards found"))
        return report

    return run


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Run a test marked `inplace_audit` under `ipd.watch()`; fail it on findings at or above fail_on."""
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    from inplace_doctor.errors import InplaceError, UsageError

    try:
        threshold, session = _marker_settings(marker, pyfuncitem.config)
    except UsageError as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)
    expected: list[Any] = []  # the findings of the in-place errors pytest.raises caught in the body
    try:
        with session, _raises_recorded(session, expected):
            result = yield
    except InplaceError:  # an in-place autograd error stopped the body: the report names both culprits
        report = _watch_report(session, pyfuncitem, expected)
        pytest.fail(_failure(report, threshold, "the test raised InplaceError"), pytrace=False)
    except BaseException:  # another failure (or a skip): show the findings next to it
        _attach(pyfuncitem, _watch_report(session, pyfuncitem, expected))
        raise
    report = _watch_report(session, pyfuncitem, expected)
    if report.failed(threshold):
        pytest.fail(_failure(report, threshold, "in-place hazards found while the test ran"), pytrace=False)
    _attach(pyfuncitem, report)  # findings below fail_on: shown with -rP
    return result


def _marker_settings(marker: pytest.Mark, config: pytest.Config) -> tuple[Severity, watch]:
    """The marker's threshold and the (not yet entered) watch session; UsageError on bad arguments."""
    from inplace_doctor.api import watch
    from inplace_doctor.errors import UsageError

    unknown = sorted(set(marker.kwargs) - _MARKER_KWARGS)
    if marker.args or unknown:
        what = f"unknown argument(s) {', '.join(unknown)}" if unknown else "positional arguments"
        raise UsageError(f"{what}; it takes select=, ignore=, fail_on=")
    fail_on = marker.kwargs.get("fail_on")
    threshold = _severity(fail_on if fail_on is not None else _default_fail_on(config))
    return threshold, watch(select=marker.kwargs.get("select"), ignore=marker.kwargs.get("ignore"))


@contextlib.contextmanager
def _raises_recorded(session: watch, expected: list[Any]) -> Generator[None, None, None]:
    """While the body runs, the findings of every in-place error that `pytest.raises` caught go to `expected`.

    The context manager `pytest.raises(...)` returns (its class, in any pytest) has its `__exit__`
    wrapped: an exception it caught, matched against its type and `match=`, is the test's subject.
    """
    raises_class = type(pytest.raises(Exception))
    own = "__exit__" in vars(raises_class)  # else inherited: deleted again, not set, afterwards
    caught = raises_class.__exit__

    def exit_recording(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
        __tracebackhide__ = True
        suppressed = caught(self, exc_type, exc, tb)
        if suppressed and isinstance(exc, Exception):
            expected.extend(session.expected(exc))
        return suppressed

    raises_class.__exit__ = exit_recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own:
            raises_class.__exit__ = caught  # type: ignore[method-assign]
        else:
            del raises_class.__exit__


def _watch_report(session: watch, item: pytest.Function, expected: list[Any]) -> Report:
    """The session's report, less the findings of the errors the test expected (named in a note)."""
    report = session.report()
    report.target = item.nodeid
    caught = [f for f in report.findings if any(f is e for e in expected)]
    if caught:
        report.findings = [f for f in report.findings if not any(f is c for c in caught)]
        where = ", ".join(f"{f.code} at {f.mutation.file}:{f.mutation.line}" for f in caught)
        report.notes.append(f"{_EXPECTED_NOTE}: the in-place error of {where}")
    return report


def _attach(item: pytest.Function, report: Report) -> None:
    if report.findings or any(note.startswith(_EXPECTED_NOTE) for note in report.notes):
        item.add_report_section("call", "inplace-doctor", str(report))
