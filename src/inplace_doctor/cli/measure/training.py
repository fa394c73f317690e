"""What `memory` and `optimize` share: both measure training steps of the model, so both take an
optimizer, a step count, text or JSON, and write HTML and PNG views of the memory timeline."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import TYPE_CHECKING, Any

from ..args import add_force, add_format, add_html, add_model, add_seed, listing
from ..errors import CliUsageError
from ..model import build_model
from ..output import Destination, check_outputs, write_output

if TYPE_CHECKING:
    from ..args import Parser, Subcommands

OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "none")
FORMATS = ("text", "json")  # what `print_result` writes: --help and the check below both read this


def add_training_parser(sub: Subcommands, name: str, help: str) -> Parser:
    """The parser of `memory` or `optimize`, with the options they share; the caller adds its own after them."""
    cmd = sub.add_parser(name, help=help)
    add_model(cmd)
    cmd.add_argument("--optimizer", default="sgd-momentum", help=f"one of {', '.join(OPTIMIZERS)} (default sgd-momentum)")
    cmd.add_argument("--steps", type=int, default=2, help="training steps per measurement; the last is reported (default 2)")
    add_format(cmd, listing(FORMATS))
    add_html(cmd)
    cmd.add_argument("--png", metavar="FILE", help="also write the memory timeline as a PNG (needs matplotlib)")
    add_seed(cmd)
    add_force(cmd)
    return cmd


def optimizer_factory(name: str) -> Any:
    import torch

    key = name.strip().lower()
    makers = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.01),
        "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
        "none": None,
    }
    if key not in makers:
        close = difflib.get_close_matches(key, list(makers), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(OPTIMIZERS)}"
        raise CliUsageError(f"unknown optimizer {name!r}; {hint}")
    make = makers[key]
    if make is None:
        return None

    def build(params: Any) -> Any:
        params = list(params)
        return make(params) if params else None  # a model without parameters takes no optimizer step

    return build


def progress() -> Any:
    """A live status line on a terminal (stderr); silent otherwise."""
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext(lambda stage: None)
    from rich.console import Console

    console = Console(stderr=True)

    @contextlib.contextmanager
    def status() -> Any:
        with console.status("starting") as live:
            yield lambda stage: live.update(stage)

    return status()


def training_setup(ns: argparse.Namespace) -> tuple[Any, Any, tuple[Any, ...], dict[str, Any], dict[str, Destination]]:
    """Check the format and the files to write, then (optimizer factory, model in its mode, args,
    kwargs, the checked files by option)."""
    if ns.format not in FORMATS:
        raise CliUsageError(f"unknown format {ns.format!r}; choose {listing(FORMATS)}")
    optimizer = optimizer_factory(ns.optimizer)
    # A missing folder, or a file that is not ours to replace, fails now, not after the measurement;
    # each path is made absolute before the factory runs (it may change directory).
    named = {"--html": ns.html, "--png": ns.png, "--write": getattr(ns, "write", None)}
    outputs = check_outputs(named, force=ns.force, config="--write")
    model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    model.train(not ns.eval)
    return optimizer, model, args, kwargs, outputs


def write_html(outputs: dict[str, Destination], title: str, **parts: Any) -> None:
    """`--html FILE`, when given: the page of `parts` (plan, memory)."""
    from ...render.html import html_page

    if "--html" in outputs:
        write_output(outputs["--html"], html_page(title, **parts).encode("utf-8", "backslashreplace"))


def write_png(outputs: dict[str, Destination], series: Any) -> None:
    """`--png FILE`, when given: the memory timeline, or a note on stderr without matplotlib."""
    from ...render.html import png_bytes

    if "--png" not in outputs:
        return
    data = png_bytes(series)
    if data is None:
        print("note: --png needs matplotlib (pip install matplotlib); no PNG written", file=sys.stderr)
    else:
        write_output(outputs["--png"], data)
