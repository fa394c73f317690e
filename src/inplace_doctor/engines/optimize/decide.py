"""optimize: decide, per call site, whether in-place is safe; measure what it saves.

    plan = ipd.optimize(model, x, optimizer=opt)
    plan.apply(model)              # or ipd.apply_config(model, "inplace.toml")
    plan.write("inplace.toml")

How a decision is made, for every module with an `inplace` option that the
traced run executed (a module called from several places is one site: it is
safe only if every call is):

1. Unsafe: audit the model with every such flag on; a site is unsafe when an
   error or warning finding names its write (IPD101 a saved tensor, IPD105 a
   later read, IPD106 the caller's input, IPD102/103 a leaf or view, ...).
   Turn those off and audit again until no finding names a flag: one site's
   write can reach another's tensor only through aliasing the first created.
   A module first reached in a later round (the forward raised before it
   with an unsafe site on) is a site from then on.
2. Effect: measure the training step's peak (`ipd.memory`) with the unsafe
   sites off and the safe ones as shipped, and with every safe one on. Safe
   sites are turned on only where that lowers the peak (each measured on its
   own); otherwise they are reported "safe, saves 0 bytes": enabling them adds
   risk for no gain. `enable_safe=True` turns them all on. A safe site with
   a forward (pre-)hook is never turned on: the hook is handed its input,
   which in place the module overwrites, and what it keeps is read where no
   audit or verify run looks.
3. Proof: `verify` compares the planned configuration with the out-of-place
   program (outputs, loss, gradients, buffers, inputs, and parameters after
   optimizer steps). A site it names is turned off and the plan is redone, so
   the plan it returns is one verify accepts.

Functional `inplace=True` calls cannot be switched from outside the code:
they are decided the same way and reported with the line to change (verify
runs with the unsafe ones switched off, as if the line were changed).
`Search` (search.py) runs these rounds; assemble.py measures the result against the shipped
configuration and builds the `Plan`; checkpoint.py measures activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...errors import UsageError
from ..preserve import refuse_meta, tensors_in
from ..training import LossFn
from .assemble import build_plan, measure_plan
from .checkpoint import CHECKPOINT_MIN_SHARE, checkpoint_suggestion
from .plan import Plan
from .search import Search


def optimize(
    model: torch.nn.Module,
    *args: Any,
    loss_fn: LossFn | None = None,
    optimizer: Any = None,
    enable_safe: bool = False,
    suggest_checkpoint: bool = True,
    checkpoint_min_share: float | None = None,
    steps: int = 2,
    input_specs: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> Plan:
    """Decide every in-place site of `model` from evidence; the model itself is not changed.

    Args:
        model: the model as shipped, in the mode to plan for (train or eval).
        *args, **kwargs: its inputs.
        loss_fn: output -> scalar loss; default: the sum of floating outputs.
        optimizer: an optimizer over `model`'s parameters, or `params -> optimizer`;
            its step is part of the measured peak and of the verification.
        enable_safe: turn on every safe site, not only those that lower the peak.
        suggest_checkpoint: also measure checkpointing the module that holds
            the most saved activations; it is suggested only when it lowers the
            peak by at least `CHECKPOINT_MIN_SHARE` (5%) of it, otherwise
            `plan.checkpoint_declined` says why in one line.
        checkpoint_min_share: that threshold as a share of the peak (default
            `CHECKPOINT_MIN_SHARE`); 0 measures and reports the largest holder
            whatever it saves (benchmarks/memory.py does, for its table).
        steps: training steps per memory measurement (the last is reported).
        input_specs: how to name the inputs in the config header (the CLI's `--input`).
        progress: called with a short description of each stage.
    """
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"optimize() needs a torch.nn.Module, got {type(model).__name__}")
    refuse_meta(model, tensors_in((args, kwargs)), "optimize")
    search = Search(model, args, kwargs, loss_fn, optimizer, steps, progress or (lambda stage: None))
    try:
        search.trace_sites()
        decided = search.decide(enable_safe)
        measured = measure_plan(search, decided)
        plan = build_plan(search, decided, measured, input_specs)
        if suggest_checkpoint:
            search.say("measuring activation checkpointing of the largest holder")
            share = CHECKPOINT_MIN_SHARE if checkpoint_min_share is None else checkpoint_min_share
            plan.checkpoint = checkpoint_suggestion(
                model, decided.plan_flags, plan, args, kwargs, loss_fn, optimizer, steps, search.rng, share
            )
        return plan
    finally:
        search.rng.restore()
