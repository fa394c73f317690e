"""`inplace-doctor run`: the parser and the report of the `run` subcommand; `script.py` runs the
script under watch(). (Not `run.py`: `run` is the console-script function `cli.run`.)"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from ..args import (
    add_check_contents,
    add_fail_on,
    add_force,
    add_format,
    add_output,
    add_rule_selection,
    add_stack,
    add_tracer_mode,
    findings_exit,
    report_formats,
    rule_config,
)
from ..errors import EXIT_FINDINGS, CliUsageError
from ..output import check_outputs, write_report

if TYPE_CHECKING:
    from collections.abc import Callable

    from ...report import Report
    from ..args import Subcommands
    from .steps import RunStats


def add_parser(sub: Subcommands) -> None:
    runner = sub.add_parser(
        "run", help="run a training script (or -m module) as python would, under watch()",
        usage="inplace-doctor run [options] (SCRIPT.py | -m MODULE) [ARGS ...]",
        description="Run a training script (or -m module) as python would, under watch(). The script's output and "
                    "traceback are its own; the report goes to stderr (or --output FILE).",
    )
    runner.add_argument("--fail-fast", action="store_true", help="stop at the overwriting op itself")
    runner.add_argument(
        "--steps", type=int, metavar="N",
        help="watch only the first N training steps, then run at full speed. A step is an optimizer step (step() "
             "of any torch.optim optimizer); until the first one is seen, and in a script without one, a backward "
             "pass. When N backward passes come before any optimizer step, watching goes on until an optimizer "
             "step (then optimizer steps are counted) or the next backward pass (watching stops there). The last "
             "line says which was counted",
    )
    add_check_contents(runner)
    add_tracer_mode(runner)
    runner.add_argument(
        "--verify", action="store_true",
        help="after the script ends, verify each model it ran (the first call of each top-level module while "
             "watched) against its out-of-place form, as `inplace-doctor verify` does: outputs, gradients, "
             "buffers and inputs, on the arguments of that call; exit 1 when one differs",
    )
    runner.add_argument(
        "--prove", action="store_true",
        help="after the script ends, check each fix its error and warning findings carry on a scratch copy of "
             "the project, as `inplace-doctor fix` does (no file of yours changes), and write the report with "
             "what the checks showed: proven fixes are `proven` (JSON fixes[].applicability and evidence; "
             "SARIF fixes[], for viewers that apply them: GitHub code scanning does not read them). Each check runs the "
             "script again",
    )
    add_rule_selection(runner, "only these rule codes or prefixes", "skip these rule codes or prefixes")
    add_fail_on(runner, "error, warning (default), info or never")
    add_format(runner, f"report format: {report_formats(' (default)')}")
    add_output(runner, "write the report to FILE (default: stderr); the terminal then shows only the script's "
                       "own output")
    add_stack(runner)
    add_force(runner)
    runner.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    runner.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS ...]")
    runner.set_defaults(handler=command)


# The options of `run` that take a value: `split_run` skips the value with the option.
_VALUE_OPTIONS = {"--steps", "--select", "--ignore", "--fail-on", "--format", "--output", "--stack"}


def split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """`run [our options] (SCRIPT | -m MODULE) [script args]`: everything after the
    script (or module) belongs to it, unchanged, even what looks like our options."""
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if token.startswith("-m") and len(token) > 2:  # -mpackage.module
            return argv[:i] + ["-m", token[2:]], argv[i + 1 :]
        if token in _VALUE_OPTIONS:
            i += 2
            continue
        if token.startswith("-"):
            i += 1
            continue
        return argv[: i + 1], argv[i + 1 :]
    return argv, []


def command(ns: argparse.Namespace) -> int:
    from ...render import get_renderer
    from .script import run_script
    from .script_verify import ModelCalls

    renderer = get_renderer(ns.format)
    if ns.module:
        target, args, module = ns.module, list(ns.target), True
    elif ns.target:
        target, args, module = ns.target[0], list(ns.target[1:]), False
        if not os.path.isfile(target):
            raise CliUsageError(f"no script {target!r}: give a path to a .py file, or -m MODULE")
    else:
        raise CliUsageError("run needs a script: inplace-doctor run train.py [ARGS ...] or -m MODULE [ARGS ...]")
    if ns.steps is not None and ns.steps < 1:
        raise CliUsageError(f"--steps must be at least 1, got {ns.steps}")
    config = rule_config(ns)  # unknown codes fail before the script runs
    # Checked, and made absolute, before the script runs: a missing folder fails now, and a script
    # that changes directory does not move the report; the script itself is never the report's file.
    outputs = check_outputs({"--output": ns.output}, force=ns.force)
    if ns.output and not module and os.path.realpath(outputs["--output"].path) == os.path.realpath(target):
        raise CliUsageError(f"--output {ns.output!r} is the script being run; name another file for the report")
    models = ModelCalls() if ns.verify else None
    root = os.path.realpath(os.getcwd())  # the project the fixes are checked in: before the script moves
    status, report, stats = run_script(
        target, args, module=module, fail_fast=ns.fail_fast, steps=ns.steps, select=config.select,
        ignore=config.ignore, per_module_ignores=config.per_module_ignores, check_contents=ns.check_contents,
        models=models, deep=ns.deep,
    )
    report.verify_results = models.verify_all(stats.rank) if models is not None else []
    verified = [str(v) for v in report.verify_results]
    report.notes.extend(verified)
    report.target = f"-m {target}" if module else target
    if report.rank is None:
        report.rank = stats.rank
    report.command = "run"
    report.stack = ns.stack
    summary = stats.summary(ns.steps)
    if ns.prove:
        report = _proven(report, root, target, args, module, ns)
    if ns.output:  # the report, and what was watched, to FILE; the terminal keeps the script's output only
        report.notes.append(summary)
        write_report(outputs["--output"], renderer, report)
    else:
        _to_terminal(report, renderer, ns.format, stats, summary, verified)
    if status:
        return int(status)
    if report.verified_different:
        return EXIT_FINDINGS
    return findings_exit(config, report)


def _to_terminal(report: Report, renderer: Callable[[Report, TextIO], None], fmt: str, stats: RunStats,
                 summary: str, verified: list[str]) -> None:
    """The report on stderr, after the script's own output: with findings (or in another format than
    text) the rendered report, else one line of what was watched and the notes a clean run keeps."""
    sys.stderr.flush()
    if stats.diagnosis:
        print(f"inplace-doctor: {stats.diagnosis}", file=sys.stderr)
    if report.findings or fmt != "text":
        renderer(report, sys.stderr)
    else:
        compiled = report.stats.get("compiled_calls_run_eagerly")
        if compiled:  # the one note a clean run's terminal needs: what ran was not the compiled code
            summary += f"; {compiled} torch.compile'd call(s) ran eagerly while watched"
            if stats.compiled_after_window():  # said only when compiled code did run after the window
                summary += ", compiled as usual after"
    print(f"inplace-doctor: {len(report.findings)} finding(s); {summary}", file=sys.stderr)
    if not report.findings and fmt == "text":  # the report above, when printed, holds them
        for note in [*verified, *([stats.threads] if stats.threads else [])]:
            print(f"inplace-doctor: {note}", file=sys.stderr)


def _proven(report: Report, root: str, target: str, args: list[str], module: bool, ns: argparse.Namespace) -> Report:
    """`run --prove`: the report with each fix checked on a scratch copy of the project (`fix_search`)."""
    from ...findings import Applicability
    from ..proof.fix_search import search, why_not, with_evidence
    from ..proof.prove import Run, Workspace, serious

    first = Run(0, report, None, "", root)
    if not serious(first.findings):
        return report
    options = tuple(x for option, value in (("--select", ns.select), ("--ignore", ns.ignore)) if value
                    for x in (option, value))

    def say(line: str) -> None:  # with --output the terminal keeps the script's output only
        if not ns.output:
            print(line, file=sys.stderr)

    try:
        ws = Workspace(root, target, args, ns.steps, module=module, options=options)
    except CliUsageError as e:  # the project cannot be copied: the report stands, unproven
        report.notes.append(f"--prove: no fix was checked: {e}")
        return report
    try:
        found = search(ws, first, unsafe=False, say=say)
    except CliUsageError as e:  # an edit that cannot be planned: the report stands, unproven
        report.notes.append(f"--prove: no fix was checked: {e}")
        return report
    finally:
        ws.close()
    marked = with_evidence(report, found, root)
    proven = sum(fx.applicability is Applicability.PROVEN for f in marked.findings for fx in f.fixes)
    if proven:
        marked.notes.append(
            f"--prove: {proven} fix(es) proven on this program: with the edits, in a copy of the project, the "
            "findings they fix are gone, nothing new is reported, and forward values, gradients and state equal "
            "the intended program's bit for bit; `inplace-doctor fix` writes them")
    else:
        why = found.reference_failed or (why_not(found.accepted[-1].verdict) if found.accepted
                                         else "; ".join(found.rejected[:3]) or "no finding has a fix with edits")
        marked.notes.append(f"--prove: no fix proven: {why}")
    return marked
