"""`inplace-doctor verify`: the model's in-place configuration against its out-of-place form,
run side by side; exit 1 when they differ."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .args import add_config, add_model, add_seed, learning_rate, tolerance
from .errors import EXIT_FINDINGS, EXIT_OK, model_raises
from .model import apply_config_option, build_model

if TYPE_CHECKING:
    from .args import Subcommands


def add_parser(sub: Subcommands) -> None:
    check = sub.add_parser("verify", help="check that the in-place configuration computes what its out-of-place form does")
    add_model(check, eval_help="verify in eval mode (default: train mode)")
    check.add_argument("--steps", type=int, default=1, help="training steps per run (default 1)")
    check.add_argument("--sgd", type=learning_rate, metavar="LR", help="also take SGD steps with this learning rate and compare parameters")
    check.add_argument("--atol", type=tolerance("--atol", "1e-6"), default=1e-6, help="absolute tolerance: finite, at least 0 (default 1e-6)")
    check.add_argument("--rtol", type=tolerance("--rtol", "1e-5"), default=1e-5, help="relative tolerance: finite, at least 0 (default 1e-5)")
    add_seed(check)
    add_config(check)
    check.set_defaults(handler=command)


def command(ns: argparse.Namespace) -> int:
    import torch

    from ..api import verify

    model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    apply_config_option(model, ns.config)
    model.train(not ns.eval)
    optimizer = (lambda params: torch.optim.SGD(params, lr=ns.sgd)) if ns.sgd is not None else None
    mode = "eval" if ns.eval else "train"
    with model_raises(model, lambda: f"during verify ({ns.steps} {mode}-mode step(s) of the in-place and "
                                     "out-of-place forms; nothing compared yet)"):
        result = verify(model, *args, steps=ns.steps, optimizer=optimizer, atol=ns.atol, rtol=ns.rtol, **kwargs)
    print(f"inplace-doctor verify of {ns.spec} ({'eval' if ns.eval else 'train'} mode)\n")
    print(result)
    return EXIT_OK if result else EXIT_FINDINGS
