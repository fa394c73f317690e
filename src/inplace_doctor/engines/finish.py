"""The end of an audit or watch session: findings sorted, and the report's statistics and
notes filled from what the tracer counted; what an error that stopped the model was."""

from __future__ import annotations

from ..errors import ModelError
from ..findings import Finding
from ..report import Report
from ..rules import select_rules
from ..rules.dispatch import Analyzer
from ..rules.phrasing import raised_in_backward
from ..trace.raised.blame import exception_text, forget_frames, internal_error, printable_text, raised_by_the_tool
from ..trace.tracer import Tracer


def finish_report(report: Report, tracer: Tracer, analyzer: Analyzer) -> Report:
    from .distributed import current_rank

    report.findings = sorted_findings(report.findings)
    report.rank = current_rank()
    report.stats = {
        "ops": tracer.ops,
        "saved_tensors": tracer.saves,
        "writes": tracer.writes,
        "predictions_dropped": analyzer.dropped,
    }
    if tracer.fast:  # it sees no op but writes (and those of a per-op window): no count of ops to give
        del report.stats["ops"]
        report.stats["fast_tracer"] = 1
    if analyzer.harmless:  # IPD110 predictions whose written positions backward sent exactly zero gradient
        report.stats["predictions_harmless"] = analyzer.harmless
    compiled = tracer.compiled.note()
    if compiled is not None:
        report.stats["compiled_calls_run_eagerly"] = tracer.compiled.calls
        report.notes.append(compiled)
    for note in (tracer.transforms.note(), tracer.threads.note(), _saved_tensors_note(tracer), tracer.entry_points.note()):
        if note is not None:
            report.notes.append(note)
    scripted = sorted(set(tracer.modules.scripted))
    if scripted:
        names = ", ".join(f"`{name}`" for name in scripted)
        report.notes.append(
            f"TorchScript module{'s' if len(scripted) > 1 else ''} {names} ran while traced: {'their' if len(scripted) > 1 else 'its'} "
            "ops were checked, but TorchScript keeps no Python lines, so sites inside name the line that called it; "
            "with PYTORCH_JIT=0 set, torch.jit.script returns the Python module and both lines are named"
        )
    if analyzer.dropped:
        n = analyzer.dropped
        report.notes.append(
            f"{n} write{'s' if n != 1 else ''} changed tensors saved by graphs that were freed without a backward "
            "reading them: not errors (PyTorch never checks a tensor no backward reads)"
        )
    return report


def sorted_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code, f.mutation.file or "", f.mutation.line or 0))


def _saved_tensors_note(tracer: Tracer) -> str | None:
    """The report's line when the program's saved-tensor hooks left the tracer's unset."""
    if not tracer.program_hooks:
        return None
    return (
        "saved-tensor hooks your program set before the watch (saved_tensors_hooks, save_on_cpu) pack what "
        "autograd saves: the tool set none of its own, which would have replaced yours, so it saw no saved "
        "tensor (IPD101, IPD104 and IPD109 were not looked for); autograd checks no version of them either"
    )


def classify_or_raise(exc: Exception, tracer: Tracer, analyzer: Analyzer, report: Report, stage: str, name: str) -> None:
    """What the model's uncaught `exc` was: an in-place error a rule reports (noted in `report`), or
    the model's own error, re-raised as `ModelError` with how far the tool got (the tool's crash: exit 4)."""
    if raised_by_the_tool(exc):
        raise internal_error(exc) from exc
    text = printable_text(exc)
    if text is None:  # a user's exception class whose __str__ raises: no rule reads it
        raise ModelError(
            f"{name} raised {type(exc).__name__} during {stage} ({tracer.progress()}): {exception_text(exc)}"
        ) from exc
    event = tracer.describe_exception(exc)
    if analyzer.handle(event):
        report.notes.append(f"{stage} stopped: PyTorch raised {type(exc).__name__} at the op")
        forget_frames(exc)
        return
    unselected = Analyzer(select_rules(), root_label=analyzer.root_label).handle(event)
    if unselected:
        codes = ", ".join(sorted({f.code for f in unselected}))
        report.notes.append(f"{stage} stopped at an in-place error of a rule not selected ({codes})")
        forget_frames(exc)
        return
    if analyzer.suppressed:
        report.notes.append(f"{stage} stopped at the in-place error of a suppressed finding (PyTorch still raises it)")
        forget_frames(exc)
        return
    in_backward = raised_in_backward(event, analyzer.root_label)
    if in_backward is not None:  # the forward line that created the failing node, as anomaly mode names it
        raise ModelError(f"{name} raised {type(exc).__name__} during {stage}: {in_backward}") from exc
    raise ModelError(
        f"{name} raised {type(exc).__name__} during {stage} ({tracer.progress()}): {text}"
    ) from exc
