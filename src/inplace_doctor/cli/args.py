"""The argument groups the subcommands share, each written once, and what they mean.

A subcommand's module adds its options in the order its `--help` lists them,
calling these for the ones it shares: the model to run (`PKG.MODULE:FACTORY`,
`--input`, `--eval`), `--seed`, `--format`, `--output`, `--select`/`--ignore`,
`--fail-on`, `--html`, `--config` and `--stack`. Where the help text differs
between subcommands, the caller passes it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import EXIT_FINDINGS, EXIT_OK, CliUsageError

if TYPE_CHECKING:
    from .project import ProjectConfig


class Parser(argparse.ArgumentParser):
    """A parser whose errors are `CliUsageError`s: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        raise CliUsageError(message)


if TYPE_CHECKING:
    Subcommands = argparse._SubParsersAction[Parser]  # what `add_subparsers` returns; each subcommand adds its parser


def add_model(parser: argparse.ArgumentParser, eval_help: str = "eval mode (default: train mode)") -> None:
    """The model to run: its factory, `--input` (repeatable) and `--eval`."""
    parser.add_argument("spec", metavar="PKG.MODULE:FACTORY", help="factory returning a model or (model, inputs)")
    parser.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                        help="an input tensor, e.g. 2x3x224x224 or 2x16:int64 (repeat for several)")
    parser.add_argument("--eval", action="store_true", help=eval_help)


def add_seed(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=seed_value, default=0, help="seed for weights and random inputs (default 0)")


# What `torch.manual_seed` accepts: a signed or unsigned 64-bit integer.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def seed_value(text: str) -> int:
    """`--seed N`: a whole number torch.manual_seed accepts (-2**63 to 2**64-1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not SEED_MIN <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(
            f"--seed {text} is out of range; choose a whole number from {SEED_MIN} to {SEED_MAX}, e.g. 0"
        )
    return value


def learning_rate(text: str) -> float:
    """`--sgd LR`: a number torch's SGD accepts (not negative; nan and inf are kept, and verify
    reports the non-finite values they produce)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid learning rate: {text!r}; give a number, e.g. 0.1") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--sgd {text} is negative; torch.optim.SGD needs a learning rate of at least 0, e.g. 0.1")
    return value


def tolerance(option: str, example: str) -> Callable[[str], float]:
    """`--atol X` / `--rtol X`: a finite number of at least 0. An infinite tolerance calls any two
    results equal, and NaN decides nothing, so either is a usage error, not a comparison."""

    def parse(text: str) -> float:
        fix = f"give a finite tolerance of at least 0, e.g. {option} {example}"
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid tolerance: {text!r}; {fix}") from None
        if math.isnan(value):
            raise argparse.ArgumentTypeError(f"{text} is not a number; {fix}")
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text} is negative; {fix}")
        if math.isinf(value):
            raise argparse.ArgumentTypeError(f"{text} is not finite, and with it verify calls any two results equal; {fix}")
        return value

    return parse


def add_format(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--format", default="text", help=help)


def listing(names: Sequence[str], first_note: str = "") -> str:
    """("text", "json", "sarif") -> "text, json or sarif"; `first_note` follows the first name."""
    words = [f"{names[0]}{first_note}", *names[1:]]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def report_formats(first_note: str = "") -> str:
    """The `--format` names of a report, from the renderers `--format` looks up (`render.FORMATS`)."""
    from ..render import FORMATS

    return listing(list(FORMATS), first_note)


def add_force(parser: argparse.ArgumentParser) -> None:
    """`--force`: replace an existing file that is not an earlier report of the tool's."""
    parser.add_argument("--force", action="store_true",
                        help="replace existing files the command writes, through a symbolic link too "
                             "(default: only its own earlier reports and empty files)")


def add_output(parser: argparse.ArgumentParser, help: str) -> None:
    """`--output FILE`; the report is written there by `output.write_report`."""
    parser.add_argument("--output", metavar="FILE", help=help)


def add_rule_selection(parser: argparse.ArgumentParser, select_help: str, ignore_help: str) -> None:
    """`--select` and `--ignore` (repeatable, comma-separated): read with `rule_config`."""
    parser.add_argument("--select", action="append", default=[], metavar="CODES", help=select_help)
    parser.add_argument("--ignore", action="append", default=[], metavar="CODES", help=ignore_help)


def add_fail_on(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--fail-on", metavar="SEVERITY", help=help)


def add_html(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")


def add_config(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`: applied to the built model by `model.apply_config_option`."""
    parser.add_argument("--config", metavar="FILE", help="first set the inplace flags from FILE (inplace.toml, as optimize writes it)")


def add_stack(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", type=stack_depth, default=2, metavar="N", help="frames shown per site in text: the line and the line in your code that called into it (default 2)")


def add_check_contents(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check-contents", action="store_true",
        help="fingerprint every tensor saved for backward and compare it when backward reads it, and look for "
             "the line that wrote it (IPD109: writes through NumPy, DLPack, pointers or extension kernels; "
             "without it only saved tensors whose memory was handed out are checked)",
    )


def add_tracer_mode(parser: argparse.ArgumentParser) -> None:
    """`--fast` / `--deep`: which tracer runs (issue 26); `deep` in the namespace: None (the default:
    the fast tracer when it serves every selected rule), False or True."""
    from ..rules import fast_mode_rules

    served = ", ".join(sorted(fast_mode_rules()))
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--fast", dest="deep", action="store_false",
        help=f"the fast tracer: only ops that write and tensors saved for backward enter Python, every other op "
             f"stays in C++ (the default when it serves every selected rule; it serves {served}). With another "
             "rule selected the deep tracer runs and the report says so",
    )
    group.add_argument(
        "--deep", dest="deep", action="store_true",
        help="the deep tracer: every op through a dispatch mode, for every rule",
    )
    parser.set_defaults(deep=None)


def stack_depth(text: str) -> int:
    """`--stack N`: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stack needs a whole number of frames, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--stack needs at least 1 frame, got {value}")
    return value


def codes(values: list[str], option: str = "--select") -> list[str] | None:
    """`--select A,B --select C` -> ["A", "B", "C"]; None when none was given. A value naming no
    code at all (`--select ""`) is a usage error listing the valid codes."""
    out = []
    for v in values:
        found = [c for c in v.split(",") if c.strip()]
        if not found:
            from ..rules import RULES

            raise CliUsageError(
                f"{option} {v!r} names no rule code; give codes or prefixes, e.g. {option} IPD101 "
                f"(known rules: {', '.join(sorted(RULES))})"
            )
        out.extend(found)
    return out or None


def rule_config(ns: argparse.Namespace) -> ProjectConfig:
    """`[tool.inplace-doctor]` with `--select`, `--ignore` and `--fail-on` over it; unknown codes
    fail here, before anything runs."""
    from ..rules import select_rules
    from .project import load_project_config, merged

    config = merged(load_project_config(), codes(ns.select, "--select"), codes(ns.ignore, "--ignore"), ns.fail_on)
    select_rules(config.select, config.ignore)
    return config


def findings_exit(config: ProjectConfig, report: Any) -> int:
    """1 when the report has findings at or above the `fail-on` severity, else 0."""
    threshold = config.fail_severity()
    return EXIT_FINDINGS if threshold is not None and report.failed(threshold) else EXIT_OK
