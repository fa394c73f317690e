"""Rules about in-place writes that change what the program computes, with no error at all."""

from __future__ import annotations

from ..causes import ChangedResultCause, DifferenceFacts, SideEffectCause, SideEffectFacts
from ..events import (
    InplaceErrorRaised,
    OriginalValueRead,
    SavedTensorOverwritten,
    SideEffectRepeated,
    StaleSavedTensorUsed,
)
from ..findings import Finding, Severity
from ..trace.pytorch_errors import is_stale_saved_tensor_error
from .fix_builders import write_fixes
from .phrasing import fix_for_write, tensor_desc, where
from .registry import RuleContext, make_finding, rule


@rule(
    "IPD105",
    "inplace-changes-result",
    "In-place write changes what a later op reads",
    Severity.ERROR,
    events=(OriginalValueRead,),
)
def inplace_changes_result(event: OriginalValueRead, ctx: RuleContext) -> Finding | None:
    """An in-place flag or augmented assignment changes the result: a later op reads the overwritten tensor.

    What: ``nn.ReLU(inplace=True)`` (or any ``inplace=True`` module or
    functional call) or ``x += y`` overwrote a tensor object, and a later op in
    the same forward still read that object: a residual ``y = x + relu_(x)``,
    ``torch.cat([h, act(h)])``, a list of features kept before the activation.
    With the out-of-place form, that op would have read the original values.

    Why: PyTorch raises nothing unless backward happens to need the old
    values; the forward silently computes something else (``x + relu_(x)`` is
    ``2 * relu(x)``). The finding gives the largest difference between what
    the op read and the original values on this input, which can be zero
    (say, no negative entries before a ReLU); other inputs will differ.
    Severity: error for ``inplace=True`` flags, whose only purpose is to save
    memory without changing the result; warning for augmented assignment,
    whose in-place meaning Python code may rely on deliberately.

    Example::

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.ReLU(inplace=True)

            def forward(self, x):
                return x + self.act(x)      # IPD105: reads x after act overwrote it

        Block()(torch.randn(4, 8))          # (and IPD106: the caller's batch changes)

    Fix: set the module's ``inplace=False`` (or pass ``inplace=False``), or
    write ``x = x + y`` instead of ``x += y``; or keep what the later op needs
    (``identity = x.clone()``) before the in-place call.

    Mode: deep: it compares the values each in-place call overwrote with later reads, which only the
    per-op tracer sees; ``watch(deep=False)`` selecting it runs deep.
    """
    write, read = event.write, event.read
    if event.max_difference != event.max_difference:  # NaN: the measurement met NaN
        measured = (
            "On this input the values involved hold NaN, so how far what it read is from the original could "
            "not be measured; other inputs will differ."
        )
    elif event.max_difference == float("inf"):
        measured = (
            "On this input some values it read are NaN or infinite where the original was not, or the reverse "
            "(or differ from it by more than the dtype can hold); `verify` measures the end result."
        )
    elif event.max_difference > 0:
        measured = (
            f"On this input it read values up to {event.max_difference:.6g} away from the original (whether that "
            "reaches the output depends on the ops that follow; `verify` measures the end result)."
        )
    else:
        measured = (
            "On this input the values it read happen to equal the original (difference 0), but other inputs "
            "will differ."
        )
    cause = ChangedResultCause.FLAG if event.kind == "flag" else ChangedResultCause.AUGMENTED
    return make_finding(
        "IPD105",
        cause=cause,
        what=(
            f"{where(write.site, ctx.root_label)} overwrote {tensor_desc(write.shape, write.dtype)}, and then "
            f"{where(read, ctx.root_label)} read that same tensor. With the out-of-place form it would have read "
            "the original values."
        ),
        why=f"The forward silently computes something else; PyTorch raises nothing. {measured}",
        fix=fix_for_write(write.site, ctx.root_label),
        fixes=write_fixes(write.site),
        mutation=write.site,
        read=read,
        severity=Severity.ERROR if cause is ChangedResultCause.FLAG else Severity.WARNING,
        facts=DifferenceFacts(event.max_difference),
    )


@rule(
    "IPD108",
    "side-effect-repeated-on-recompute",
    "Side effect runs again when a checkpoint recomputes",
    Severity.WARNING,
    events=(SideEffectRepeated, SavedTensorOverwritten, StaleSavedTensorUsed, InplaceErrorRaised),
)
def side_effect_repeated(
    event: SideEffectRepeated | SavedTensorOverwritten | StaleSavedTensorUsed | InplaceErrorRaised, ctx: RuleContext
) -> Finding | None:
    """State changed in forward is changed again during backward: a checkpoint's recompute repeats a side effect.

    What: ``torch.utils.checkpoint`` (reentrant or not) runs the region's
    forward a second time during backward. Everything it does to state that
    outlives the call happens twice: a training-mode BatchNorm updates its
    running statistics (and ``num_batches_tracked``) again, an in-place
    accumulation (``self.total += x.sum()``, a counter) adds twice.

    Why: training gradients are unaffected, so nothing looks wrong, but the
    running statistics used in eval mode drift (momentum applied twice per
    step) and counters and metrics are off. Severity warning: the numbers a
    model reports or uses in eval change silently.

    What is seen: training-mode batch norm ops running during backward, and
    dispatch-visible writes during backward to tensors (not requiring grad)
    that forward wrote and that are still alive. Gradient accumulation is not
    a side effect and is never reported.

    Example::

        block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        y = checkpoint(block, x, use_reentrant=False)   # block contains BatchNorm2d
        y.sum().backward()                               # IPD108: running stats updated again

    An in-place write inside a checkpointed region to a tensor saved outside
    it (the region's input) is reported here too, with both lines: PyTorch
    raises at backward (the reentrant form re-runs the write on a detached
    copy, "a leaf Variable that requires grad..."); severity error then.

    Fix: keep BatchNorm outside checkpointed regions, or freeze its statistics
    during the recompute (``torch.utils.checkpoint`` has no hook for it: use
    ``module.momentum`` bookkeeping or ``track_running_stats=False``); move
    accumulations out of the region or guard them with
    ``torch.is_grad_enabled()``/a recompute flag.

    Mode: deep: it needs the ops of a checkpoint's recompute (BatchNorm running again), which only
    the per-op tracer sees; ``watch(deep=False)`` selecting it runs deep.
    """
    if not isinstance(event, SideEffectRepeated):
        return _write_to_checkpoint_input(event, ctx)
    write = event.write
    return make_finding(
        "IPD108",
        cause=SideEffectCause.REPEATED,
        what=f"{where(write.site, ctx.root_label)} ran again during backward: {event.what} changed a second time.",
        why=(
            "A checkpointed region's forward is recomputed during backward, so its side effects happen twice; "
            "gradients are unaffected, but running statistics used in eval, counters and metrics are off."
        ),
        fix=(
            "keep BatchNorm and in-place accumulations out of the checkpointed region, or guard the "
            "accumulation so it runs once per step"
        ),
        mutation=write.site,
        facts=SideEffectFacts(event.what),
    )


def _write_to_checkpoint_input(
    event: SavedTensorOverwritten | StaleSavedTensorUsed | InplaceErrorRaised, ctx: RuleContext
) -> Finding | None:
    fix = (
        "make the write out of place inside the checkpointed function (`x = x * 2`, not `x.mul_(2)`), "
        "or clone the input first (`x = x.clone()`)"
    )
    why = (
        "The region's forward runs again during backward, on its saved inputs; writing one of them in "
        "place breaks the recompute, and PyTorch raises at backward."
    )
    if isinstance(event, InplaceErrorRaised):
        text = str(event.error).lower()
        if not event.in_checkpoint:
            return None
        if is_stale_saved_tensor_error(text):
            earlier = ctx.earlier(SideEffectCause.CHECKPOINT_INPUT)
            if earlier is not None:  # found at the write, with both lines: this error confirms it
                return earlier.with_(confirmed=True)
        elif "leaf variable" not in text:
            return None
        return make_finding(
            "IPD108", what=f"{where(event.site, ctx.root_label)} writes in place to a checkpointed region's input.",
            why=why, fix=fix, mutation=event.site, confirmed=True, severity=Severity.ERROR,
            cause=SideEffectCause.CHECKPOINT_INPUT,
        )
    write = event.write if isinstance(event, SavedTensorOverwritten) else None
    if isinstance(event, StaleSavedTensorUsed):
        prior = ctx.overwrite_for(event.saved.key)
        write = prior.write if prior is not None else None
    if write is None or not write.in_checkpoint or not event.saved.is_checkpoint_input:
        return None  # saved inside the region too: an ordinary IPD101
    if isinstance(event, SavedTensorOverwritten) and (not event.shares_version_counter or event.already_used_by_backward):
        return None
    return make_finding(
        "IPD108",
        what=(
            f"{where(write.site, ctx.root_label)} writes in place, inside a checkpointed region, to a tensor "
            f"saved at {event.saved.site.location} (the region's input)."
        ),
        why=why, fix=fix, mutation=write.site, saved=event.saved.site,
        confirmed=True if isinstance(event, StaleSavedTensorUsed) else None, severity=Severity.ERROR,
        cause=SideEffectCause.CHECKPOINT_INPUT,
    )
