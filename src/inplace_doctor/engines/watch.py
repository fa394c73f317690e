"""`watch()`: a session around any code (training steps, loops), collecting in-place findings."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any, Literal

import torch

from ..causes import Unreached
from ..errors import (
    InplaceDoctorError,
    InplaceError,
    UnsupportedModuleError,
    UsageError,
    raise_tool_error,
    tool_error_of,
)
from ..events import InplaceErrorRaised
from ..findings import Finding, Severity
from ..report import Report
from ..rules import select_rules
from ..rules.dispatch import Analyzer
from ..rules.phrasing import raised_in_backward
from ..sites import ROOT_LABEL
from ..trace.places.modules import refuse_opaque, unique_label
from ..trace.places.user_names import variable_name
from ..trace.raised.blame import internal_error, printable_text, raised_by_the_tool
from ..trace.tracer import Tracer
from . import nesting, tracer_mode
from .finish import finish_report, sorted_findings

Selection = Iterable[str] | str | None


class watch:
    """Instrument any code (training steps, loops) and collect in-place findings.

    `with ipd.watch() as session:` returns the session itself; its `findings`
    stay readable after an exception. Inside the block the program sees
    PyTorch's own errors, type and message unchanged (an `except RuntimeError`
    in it behaves as without the tool); an in-place autograd error that leaves
    the block (raised at the op, or later in backward) is re-raised as
    `InplaceError` with both culprits, PyTorch's error chained. An error
    PyTorch raised at an in-place call that the program caught is a finding
    too (`Finding.caught`). `session.report()` read inside the block lists
    the predictions no backward has reached yet as predicted. With `fail_fast=True` the error is
    raised at the overwriting op itself. A `watch()` nested in another is its
    own, and the enclosing one reports its findings too (`engines/nesting.py`).

    Args:
        *models: modules whose submodules are named relative to them
            (`layer1.0.relu`); others are named by class (`ResNet.layer1.0.relu`).
        **named_models: the same, named by you: `watch(G=g, D=d)` names
            `D.2.weight` and `G.0`, where two `Sequential`s would share a name.
        fail_fast: raise at the first error that is certain instead of
            collecting: at the op for what PyTorch raises there; for a write to
            a tensor saved for backward, when a backward reaches it (a graph
            freed without backward never raises, so neither does the tool),
            with the write's stack chained in front (`WrittenHere`).
        select, ignore: rule codes or prefixes.
        per_module_ignores: module-path glob -> codes to drop there.
        stack: frames the text report shows per site (the line, and the line
            in your code that called into it; more with a larger number).
        check_contents: fingerprint every tensor saved for backward, not only
            those whose memory `.numpy()`, DLPack or `data_ptr()` handed out,
            and look for the line that wrote one (IPD109); costs about 0.4 ms
            per saved MiB plus 50-80 µs per saved tensor on CPU (each is
            fingerprinted at save and at unpack; on GPU each reads back).
        deep: which tracer runs (issue 26). By default (None) the fast one:
            only ops that write (Python kernels at autograd's ADInplaceOrView
            key) and tensors saved for backward enter Python, every other op
            stays in C++, and per-op interception is switched on only while a
            rule awaits a read or inside a checkpoint region. When a selected
            rule needs the deep tracer (its `@rule(..., fast=False)`; `rules.fast_mode_rules()`
            lists those the fast one serves), the deep one runs and the report says why.
            `deep=True`: every aten op through a dispatch mode, always.
            `deep=False`: ask for the fast one (a note when it cannot).

    Example:
        >>> with ipd.watch() as session:
        ...     y = torch.randn(3, requires_grad=True).exp()
        ...     y.add_(1)
        >>> session.findings[0].code
        'IPD101'
    """

    def __init__(
        self,
        *models: torch.nn.Module,
        fail_fast: bool = False,
        select: Selection = None,
        ignore: Selection = None,
        per_module_ignores: dict[str, list[str]] | None = None,
        stack: int = 2,
        check_contents: bool = False,
        deep: bool | None = None,
        **named_models: torch.nn.Module,
    ) -> None:
        self._stack = stack
        self._adopted: list[list[Finding]] = []  # the finding lists of sessions nested in this one (live)
        self._parent: nesting.Session | None = None
        self._sessions: list[nesting.Session] = []
        for label, m in named_models.items():
            if not isinstance(m, torch.nn.Module):
                raise UsageError(f"watch({label}=...) needs a torch.nn.Module, got {type(m).__name__}")
        # Positional models are named by the caller's variable (`watch(G, D)`), else by class; a
        # label used twice gets a suffix, so two `Sequential`s are never one path.
        roots = []
        taken: set[str] = set()
        for label, m in [(variable_name(m) or type(m).__name__, m) for m in models] + list(named_models.items()):
            label = unique_label(label, taken)
            taken.add(label)
            roots.append((label, m))
        root_label = ROOT_LABEL if len(models) == 1 and not named_models else ""
        if len(named_models) == 1 and not models:
            root_label = next(iter(named_models))
        rules = select_rules(select, ignore)
        self._analyzer = Analyzer(rules, root_label=root_label, fail_fast=fail_fast, per_module_ignores=per_module_ignores)
        #: rules chosen that the fast tracer does not serve, which turned deep mode on (not asked for)
        wanted = tracer_mode.asked(deep)
        self.deep_because = tracer_mode.choose(rules, wanted)
        self.deep = bool(wanted) or bool(self.deep_because)
        self._asked_fast = tracer_mode.how_asked(deep, "watch(deep=False)")
        self._tracer = Tracer(self._analyzer, fail_fast=fail_fast, check_contents=check_contents, fast=not self.deep)
        self._tracer.threads.on_start = nesting.started_thread  # a watch() in the thread reports to this one
        self._tracer.modules.root_label = root_label
        for label, m in roots:
            try:
                refuse_opaque(m, "the model")
            except UnsupportedModuleError as e:
                raise UsageError(str(e)) from None
            self._tracer.modules.add_root(m, "" if root_label else label)

    @property
    def findings(self) -> list[Finding]:
        return sorted_findings(self._all_findings())

    def _all_findings(self) -> list[Finding]:
        found = nesting.merged(self._analyzer.findings, self._adopted)
        if self._tracer.active:  # read before the watch closed: what is predicted is listed as predicted
            found = found + self._analyzer.predicted()
        return found

    def adopt_session(self, findings: list[Finding], adopted: list[list[Finding]]) -> None:
        """A session nested in this one ended: its findings (and those it adopted) are this one's too."""
        self._adopted += [findings, *adopted]

    def thread_watched(self, thread: Any) -> None:
        """A thread started inside this session entered a watch() of its own."""
        self._tracer.threads.watched(thread)

    @property
    def tracer(self) -> Tracer:
        return self._tracer

    def report(self) -> Report:
        """The findings so far; read inside the block, predictions no backward has reached yet are
        listed as predicted (`Unreached.PENDING`) and errors the program caught are in."""
        if self._tracer.active:
            self._tracer.flush()  # writes settle at the next op: the last one's prediction is made now
            self._tracer.settle_caught()
        report = Report(
            findings=self._all_findings(), command="watch", root_label=self._analyzer.root_label,
            stack=self._stack,
        )
        report = finish_report(report, self._tracer, self._analyzer)
        if self.deep_because:
            report.notes.append(tracer_mode.switched_note(self.deep_because, self._asked_fast))
        return report

    def failed(self, fail_on: Severity = Severity.WARNING) -> bool:
        return any(f.severity.rank >= fail_on.rank for f in self._all_findings())

    def __enter__(self) -> watch:
        if self._tracer.active:  # before `nesting.enter`, which would replace the open session's place
            raise UsageError(
                "this watch is already open: a `with` on the same `ipd.watch()` object inside itself; "
                "open a new `ipd.watch()` for a nested session"
            )
        self._parent, self._sessions = nesting.enter(self)
        try:
            self._tracer.__enter__()
        except BaseException:
            nesting.leave(self, self._sessions)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        try:
            return self._exit(exc_type, exc, tb)
        finally:
            nesting.leave(self, self._sessions)
            if self._parent is not None:  # its findings list is live: what is confirmed later reaches it too
                self._parent.adopt_session(self._analyzer.findings, self._adopted)
                self._parent = None

    def _exit(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self._tracer.__exit__(exc_type, exc, tb)
        carried = tool_error_of(exc)  # an InplaceError, or PyTorch's error carrying the tool's diagnosis
        described = self._described(exc) if carried is None else None
        if carried is not None and not carried.in_backward:  # a backward's: marked where it stopped
            self._analyzer.finish(Unreached.STOPPED_AT_INPLACE_ERROR, Severity.WARNING)
        elif described is not None and described.node is not None:  # raised inside backward, in that node
            self._analyzer.finish(Unreached.STOPPED_AT_ERROR, Severity.WARNING)
        self._analyzer.finish(Unreached.NOT_REACHED_IN_WATCH)
        if carried is not None:
            self._analyzer.adopt(carried.findings)
            assert exc is not None
            raise_tool_error(exc)  # leaves the watch as the InplaceError naming both lines, from PyTorch's
            return False
        if exc is None or not isinstance(exc, Exception):
            return False
        if raised_by_the_tool(exc):
            raise internal_error(exc) from exc
        if described is None:  # a user's exception class whose __str__ raises: no rule reads it
            return False
        # PyTorch's in-place errors are RuntimeErrors: an AssertionError quoting one (pytest.raises'
        # match= that did not match) is the program's own failure, whatever its text says.
        produced = self._analyzer.handle(described) if isinstance(exc, RuntimeError) else []
        if produced:
            raise InplaceError(produced[0].message, produced) from exc
        self._note_backward_origin(exc, described)
        return False

    def _described(self, exc: BaseException | None) -> InplaceErrorRaised | None:
        """Where the program's own exception happened; None for none, the tool's, an InplaceError, an unreadable one."""
        if not isinstance(exc, Exception) or isinstance(exc, InplaceError) or raised_by_the_tool(exc):
            return None
        if printable_text(exc) is None:
            return None
        return self._tracer.describe_exception(exc)

    def expected(self, exc: Exception) -> list[Finding]:
        """The findings of an in-place error the program caught on purpose (a test's `pytest.raises`):
        PyTorch's error of a backward, the findings it carries; an error PyTorch raised at an in-place
        call, its finding now (it is not reported again as caught). Empty for another error."""
        event = self._tracer.take_noted(exc)
        carried = tool_error_of(exc)
        if carried is not None:
            return list(carried.findings)
        return self._analyzer.handle(event) if event is not None else []

    def annotate(self, exc: BaseException) -> None:
        """Add to an error raised inside backward, not an in-place one, a note naming the forward
        line that created the failing node (its traceback names only `backward()`)."""
        if isinstance(exc, Exception) and not isinstance(exc, InplaceDoctorError):
            self._note_backward_origin(exc, self._tracer.describe_exception(exc))

    def _note_backward_origin(self, exc: BaseException, event: Any) -> None:
        text = raised_in_backward(event, self._analyzer.root_label)
        if text is not None:
            note = f"inplace-doctor: {text}"
            if note not in getattr(exc, "__notes__", ()):
                exc.add_note(note)
