"""`inplace-doctor audit`: one instrumented forward + backward of a model; the report on stdout
(or `--output FILE`), exit 1 for findings at or above `--fail-on`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .args import (
    add_check_contents,
    add_config,
    add_fail_on,
    add_force,
    add_format,
    add_html,
    add_model,
    add_output,
    add_rule_selection,
    add_seed,
    add_stack,
    add_tracer_mode,
    findings_exit,
    report_formats,
    rule_config,
)
from .errors import model_raises
from .model import apply_config_option, build_model
from .output import check_outputs, screen, write_report, write_text

if TYPE_CHECKING:
    from .args import Subcommands


def add_parser(sub: Subcommands) -> None:
    audit = sub.add_parser("audit", help="audit a model in one instrumented forward + backward")
    add_model(audit, eval_help="audit in eval mode (default: train mode)")
    audit.add_argument("--no-backward", action="store_true", help="run forward only")
    add_format(audit, report_formats())
    add_output(audit, "write the report to FILE instead of stdout")
    add_rule_selection(audit, "only these rule codes or prefixes (comma-separated)",
                       "skip these rule codes or prefixes (comma-separated)")
    add_seed(audit)
    add_html(audit)
    add_fail_on(audit, "error, warning (default), info or never: exit 1 at or above it")
    add_config(audit)
    add_stack(audit)
    add_check_contents(audit)
    add_tracer_mode(audit)
    add_force(audit)
    audit.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    from ..api import audit
    from ..render import get_renderer

    renderer = get_renderer(ns.format)
    config = rule_config(ns)  # validates codes before running anything
    # Checked, and made absolute, before the factory runs: a missing folder fails now, and a
    # factory that changes directory does not move the report.
    outputs = check_outputs({"--output": ns.output, "--html": ns.html}, force=ns.force)
    model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    apply_config_option(model, ns.config)
    model.train(not ns.eval)
    with model_raises(model, lambda: "during audit"):  # its own errors audit words itself; this is sys.exit
        report = audit(model, *args, backward=not ns.no_backward, select=config.select, ignore=config.ignore,
                       per_module_ignores=config.per_module_ignores, check_contents=ns.check_contents, deep=ns.deep, **kwargs)
    report.target = ns.spec
    report.stack = ns.stack
    if ns.output:
        write_report(outputs["--output"], renderer, report)
    else:
        renderer(report, screen(outputs))
    if ns.html:
        from ..render.html import html_page

        write_text(outputs["--html"], html_page(f"inplace-doctor audit: {ns.spec}", report=report), "backslashreplace")
    return findings_exit(config, report)
