"""`inplace-doctor memory`: where a training step's memory goes, and why autograd keeps it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...errors import ModelError
from ...trace.raised.pytorch_errors import is_stale_saved_tensor_error
from ..errors import EXIT_OK, model_raises
from ..output import print_result, screen
from .training import add_training_parser, progress, training_setup, write_html, write_png

if TYPE_CHECKING:
    from ..args import Subcommands




def add_parser(sub: Subcommands) -> None:
    cmd = add_training_parser(sub, "memory", "measure where a training step's memory goes, and why autograd keeps it")
    cmd.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    from ...api import memory as measure_memory
    optimizer, model, args, kwargs, outputs = training_setup(ns)
    with progress() as say, model_raises(model, lambda: f"during memory (measuring {ns.steps} training step(s))"):
        say(f"measuring {ns.steps} training step(s)")
        try:
            report = measure_memory(model, *args, optimizer=optimizer, steps=ns.steps, **kwargs)
        except RuntimeError as e:
            if not is_stale_saved_tensor_error(e):
                raise  # any other exception of the model: its traceback and one line, as audit shows it
            first = str(e).splitlines()[0]
            raise ModelError(
                f"the training step of {ns.spec} raised PyTorch's in-place error, so its memory cannot be "
                f"measured ({first}); run `inplace-doctor audit {ns.spec}` to name both culprits, the op "
                f"that overwrote and the one that saved, or `inplace-doctor optimize {ns.spec}` for a "
                "configuration that runs"
            ) from None  # the traceback names neither op: the one line says where to look instead
    report.target = ns.spec
    print_result(ns, report, screen(outputs))
    write_html(outputs, f"inplace-doctor memory: {ns.spec}", memory=[("as shipped", report)])
    write_png(outputs, [("as shipped", report)])
    return EXIT_OK
