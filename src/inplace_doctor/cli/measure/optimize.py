"""`inplace-doctor optimize`: every in-place flag decided from evidence, verified, and the memory
it saves measured; `--write FILE` saves the configuration as TOML. Exit 1 unless verified."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import EXIT_FINDINGS, EXIT_OK, model_raises
from ..output import REPLACE, STDOUT, print_result, screen, write_text
from .training import add_training_parser, progress, training_setup, write_html, write_png

if TYPE_CHECKING:
    from ..args import Subcommands


def add_parser(sub: Subcommands) -> None:
    cmd = add_training_parser(sub, "optimize", "decide every in-place flag from evidence, verify it, measure the memory it saves")
    cmd.add_argument("--write", metavar="FILE", help="write the config (TOML) to FILE, e.g. inplace.toml")
    cmd.add_argument("--enable-safe", action="store_true",
                     help="turn on every safe site, not only those that lower the peak")
    cmd.add_argument("--no-checkpoint", action="store_true", help="skip the activation-checkpointing measurement")
    cmd.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    from ...api import optimize
    optimizer, model, args, kwargs, outputs = training_setup(ns)
    specs = list(ns.input) or None
    reached = ["before its first stage"]

    def stage() -> str:
        return f"during optimize ({reached[-1]})"

    with progress() as say, model_raises(model, stage):
        def say_and_note(text: str) -> None:
            reached.append(f"at: {text}")
            say(text)

        plan = optimize(model, *args, optimizer=optimizer, enable_safe=ns.enable_safe,
                        suggest_checkpoint=not ns.no_checkpoint, steps=ns.steps, input_specs=specs,
                        progress=say_and_note, **kwargs)
    plan.target = ns.spec
    shown = screen(outputs)
    print_result(ns, plan, shown)
    if ns.write:
        config = outputs["--write"]
        write_text(config, plan.toml())
        if ns.format == "text" and config.kind != STDOUT:
            print(_replaced(config.given, config.previous, plan.toml()) if config.kind == REPLACE else f"wrote {ns.write}",
                  file=shown)
    write_html(outputs, f"inplace-doctor optimize: {ns.spec}", plan=plan)
    write_png(outputs, plan.memory_series())
    return EXIT_OK if bool(plan.verified) else EXIT_FINDINGS


def _replaced(path: str, before: bytes | None, new: str) -> str:
    """What `--write --force` changed in the file it replaced: the unified diff, so hand edits
    it dropped stay visible."""
    import difflib

    if before is None:
        return f"replaced {path}; what it held (over 1 MiB) is not shown"
    previous = before.decode("utf-8", "surrogateescape")
    if previous == new:
        return f"wrote {path} (unchanged)"
    diff = difflib.unified_diff(previous.splitlines(keepends=True), new.splitlines(keepends=True),
                                f"{path} (before)", f"{path} (written)")
    return f"replaced {path}; what changed:\n" + "".join(diff).rstrip("\n")
