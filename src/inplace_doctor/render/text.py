"""Terminal output with rich: colour only on a terminal, NO_COLOR honoured."""

from __future__ import annotations

import errno
import html
import os
from typing import TextIO

from rich.console import Console
from rich.text import Text

from ..causes import SiteRole, Unreached
from ..findings import Finding, Severity
from ..printing import renders_html, renders_text
from ..report import Report
from ..sites import ROOT_LABEL, Site, caller_frame, describe_site, source_line
from .explain.outside_writes import unlocated_write
from .fix_text import fix_lines

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "bold blue"}


_PLACES_SHOWN = 6
#: how the other line of a finding is labelled, by its role
_READ_LABELS = {SiteRole.READ: "read by", SiteRole.VIEWS_MADE: "views from"}


def _site_line(
    label: str, site: Site, root_label: str, slot: str | None = None, stack: int = 2,
    shown: set[tuple[str, int]] | None = None,
) -> list[str]:
    """The site, its source line, and the frame that called into it from other code (the training
    script's line, once per finding: `shown`); `stack` > 2 adds more outer frames, innermost first."""
    lines = [f"  {label:<12}{describe_site(site, root_label, slot)}"]
    if site.code:
        lines.append(f"  {'':<12}{site.code}")
    caller = caller_frame(site) if stack >= 2 else None
    if caller is not None and shown is not None and stack == 2:
        if (caller.file, caller.line) in shown:
            caller = None
        else:
            shown.add((caller.file, caller.line))
    if caller is not None:
        frames = [caller]
        if stack > 2:
            outer = [fr for fr in reversed(site.stack[:-1]) if fr != caller]
            frames += outer[: stack - 2]
        for frame in frames:
            code = source_line(frame)
            where = frame.location
            lines.append(f"  {'':<12}called from {where} in {frame.function}" + (f": {code}" if code else ""))
    return lines


def finding_lines(f: Finding, root_label: str = ROOT_LABEL, stack: int = 2) -> list[tuple[str, str]]:
    """(text, style) lines for one finding."""
    # PyTorch refused the op itself (IPD103): its other line, if any, is where the tensor came from
    raised_at_op = f.saved is None and (f.read is None or f.read_role is SiteRole.VIEWS_MADE)
    confirmed = "  [PyTorch raised]" if raised_at_op else "  [confirmed by backward]"
    unconfirmed = "  [predicted]" if f.unreached is Unreached.PENDING else "  [unconfirmed]"
    status = {True: confirmed, False: unconfirmed, None: ""}[f.confirmed]
    count = f"  (x{f.count})" if f.count > 1 else ""
    out = [(f"{f.severity.value:<8}{f.code}  {f.title}{status}{count}", _STYLE[f.severity])]
    unlocated = unlocated_write(f)  # IPD109: the line that wrote was not found, and why
    label = "at" if raised_at_op else "handed out" if unlocated and f.mutation.op.startswith(".") else "overwritten"
    callers: set[tuple[str, int]] = set()  # a caller line shared by the sites is printed once
    out += [(line, "") for line in _site_line(label, f.mutation, root_label, stack=stack, shown=callers)]
    if f.saved is not None:
        out += [(line, "") for line in _site_line("saved", f.saved, root_label, f.slot, stack, callers)]
    if f.read is not None:
        read_label = _READ_LABELS[f.read_role]
        out += [(line, "") for line in _site_line(read_label, f.read, root_label, stack=stack, shown=callers)]
    if len(f.places) > 1 or (f.places and f.target):
        listed = ", ".join(f.places[:_PLACES_SHOWN])
        more = f" and {len(f.places) - _PLACES_SHOWN} more" if len(f.places) > _PLACES_SHOWN else ""
        out.append((f"  {'places' if len(f.places) > 1 else 'written':<12}{listed}{more}", ""))
    if unlocated:
        out.append((f"  written: {unlocated}", "dim"))
    out.append((f"  why: {f.why}", ""))
    if f.caught:
        out.append(("  caught: your program caught PyTorch's error and went on; the operation it refused never ran", "yellow"))
    if f.unconfirmed_reason:
        out.append((f"  unconfirmed: {f.unconfirmed_reason}", "dim"))
    from_records = fix_lines(f, root_label)  # the fix as its records say it, else the rule's sentences
    sentences = [f.fix, *f.fix_alternatives] if f.fix else list(f.fix_alternatives)
    fixes = from_records or [f"fix: {fix}" for fix in sentences]
    for fix in fixes:
        out.append((f"  {fix}", "green"))
    return out


def _header(report: Report) -> str:
    what = f"{report.command} of {report.target}" if report.target else report.command
    mode = f" ({report.mode}{', forward + backward' if report.backward else ', forward only'})" if report.mode else ""
    rank = f" on rank {report.rank}" if report.rank is not None else ""
    return f"inplace-doctor {what}{mode}{rank}"


def _summary(report: Report) -> str:
    if not report.findings:
        return "No in-place hazards found."
    counts = [f"{report.count(s)} {s.value}{'s' if report.count(s) != 1 else ''}" for s in Severity if report.count(s)]
    return f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}: {', '.join(counts)}"


def _lines(report: Report) -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = [(_header(report), "bold"), ("", "")]
    for f in report.findings:
        lines += finding_lines(f, report.root_label, report.stack)
        lines.append(("", ""))
    for note in report.notes:
        lines.append((f"note: {note}", "dim"))
    lines.append((_summary(report), "bold"))
    return lines


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (`inplace-doctor audit ... | head`): the error goes on to the command
        line, which ends quietly with 141 (rich's own answer, `SystemExit(1)`, read as the model's exit)."""
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def render(report: Report, stream: TextIO, *, color: bool | None = None) -> None:
    """Write the text report; colour when `stream` is a terminal and NO_COLOR is unset."""
    if color is None:
        color = stream.isatty() and not os.environ.get("NO_COLOR")
    console = _Console(
        file=stream, force_terminal=color, no_color=not color, highlight=False, soft_wrap=True,
        emoji=False, color_system="auto" if color else None,
    )
    for text, style in _lines(report):
        console.print(Text(text, style=style if color else ""), markup=False)


@renders_text(Report)
def to_plain_text(report: Report) -> str:
    return "\n".join(text for text, _ in _lines(report)).rstrip() + "\n"


_CSS = {  # the text report's rich styles
    "bold red": "color:#b00020;font-weight:bold",
    "bold yellow": "color:#a66300;font-weight:bold",
    "bold blue": "color:#0b5394;font-weight:bold",
    "bold": "font-weight:bold",
    "green": "color:#2e7d32",
    "dim": "opacity:.7",
}


@renders_html(Report)
def to_notebook_html(report: Report) -> str:
    """Jupyter: the text report in a <pre>, headlines coloured by severity (escaped, no script)."""
    body = "\n".join(
        f'<span style="{_CSS[style]}">{html.escape(text)}</span>' if style in _CSS else html.escape(text)
        for text, style in _lines(report)
    )
    return f'<pre class="inplace-doctor-report" style="white-space:pre-wrap">{body}</pre>'

