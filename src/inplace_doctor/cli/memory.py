"""`inplace-doctor memory`: where a training step's memory goes, and why autograd keeps it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .errors import EXIT_FINDINGS, EXIT_OK
from .output import print_result, writing
from .training import add_training_parser, progress, training_setup, write_png

if TYPE_CHECKING:
    from .args import Subcommands


def add_parser(sub: "Subcommands") -> None:
    cmd = add_training_parser(sub, "memory", "measure where a training step's memory goes, and why autograd keeps it")
    cmd.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    from ..api import memory as measure_memory
    from ..render.html import write_html

    optimizer, model, args, kwargs = training_setup(ns)
    with progress() as say:
        say(f"measuring {ns.steps} training step(s)")
        try:
            report = measure_memory(model, *args, optimizer=optimizer, steps=ns.steps, **kwargs)
        except RuntimeError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(
                f"inplace-doctor: the training step of {ns.spec} raised, so its memory cannot be measured: {first}\n"
                f"run `inplace-doctor audit {ns.spec}` to name the op that overwrote and the one that saved, or "
                f"`inplace-doctor optimize {ns.spec}` for a configuration that runs",
                file=sys.stderr,
            )
            return EXIT_FINDINGS
    report.target = ns.spec
    print_result(ns, report)
    if ns.html:
        with writing(ns.html):
            write_html(ns.html, f"inplace-doctor memory: {ns.spec}", memory=[("as shipped", report)])
    write_png(ns.png, [("as shipped", report)])
    return EXIT_OK
