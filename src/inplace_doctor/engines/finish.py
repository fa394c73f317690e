"""The end of an audit or watch session: findings sorted, and the report's statistics and
notes filled from what the tracer counted."""

from __future__ import annotations

from ..findings import Finding
from ..report import Report
from ..rules.dispatch import Analyzer
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
    for note in (tracer.transforms.note(), tracer.threads.note(), tracer.saved_tensors_note(), tracer.entry_points.note()):
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
