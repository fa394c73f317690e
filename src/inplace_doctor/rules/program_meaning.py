"""Rules about in-place writes that change what the program computes, with no error at all.

Their sentences: render/explain/program_meaning.py.
"""

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
from ..trace.raised.pytorch_errors import is_stale_saved_tensor_error
from .fixes.fix_builders import write_fixes
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

        Block()(torch.randn(4, 8))          # (audit() also reports IPD106 for the batch)

    Fix: set the module's ``inplace=False`` (or pass ``inplace=False``), or
    write ``x = x + y`` instead of ``x += y``; or keep what the later op needs
    (``identity = x.clone()``) before the in-place call.

    A read of another object over the same memory made before an
    ``inplace=True`` call (``kept = h[:, :4]`` or ``h.detach()``, then
    ``act(h)``, then ``kept`` read) is one too; a view made after it, of what
    the call returned, is not.

    Not seen: explicit in-place methods (``x.relu_()``, ``x.add_(y)``),
    which say what they do, reads after the forward returns (a caller
    reading its own input again is IPD106), and, for ``x += y``, reads of
    another object over ``x``'s memory (updating a buffer through a view is
    what such code may mean). The difference is measured on this input only.

    Mode: fast (the default) and deep: the fast tracer serves it (the in-place calls are seen at the torch
    level in both modes; every op enters Python only inside a call handed an object one overwrote,
    while that object is alive; TorchScript calls count as such calls). Not seen in fast mode: a
    read by a call not handed the object itself (one reaching it through a closure or an attribute),
    and, while nothing else awaits a read, an in-place call made inside backward or ``x += y`` on a
    Tensor subclass that defines its own ``__iadd__``.
    """
    write = event.write
    cause = ChangedResultCause.FLAG if event.kind == "flag" else ChangedResultCause.AUGMENTED
    return make_finding(
        "IPD105",
        cause=cause,
        root_label=ctx.root_label,
        fixes=write_fixes(write.site),
        mutation=write.site,
        read=event.read,
        severity=Severity.ERROR if cause is ChangedResultCause.FLAG else Severity.WARNING,
        facts=DifferenceFacts(event.max_difference, write.shape, write.dtype, event.through_alias),
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

    Mode: fast (the default) and deep: the fast tracer serves it (every op enters Python only while a
    checkpoint region's forward or recompute runs). Of reentrant checkpoints written as an
    ``autograd.Function`` it sees those named like one (``CheckpointFunction``: torch's, DeepSpeed's,
    Megatron's, fairscale's); the deep tracer sees a BatchNorm running in any backward.
    """
    if not isinstance(event, SideEffectRepeated):
        return _write_to_checkpoint_input(event, ctx)
    write = event.write
    return make_finding(
        "IPD108",
        cause=SideEffectCause.REPEATED,
        root_label=ctx.root_label,
        mutation=write.site,
        facts=SideEffectFacts(event.what),
    )


def _write_to_checkpoint_input(
    event: SavedTensorOverwritten | StaleSavedTensorUsed | InplaceErrorRaised, ctx: RuleContext
) -> Finding | None:
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
            "IPD108", mutation=event.site, confirmed=True, severity=Severity.ERROR,
            cause=SideEffectCause.CHECKPOINT_INPUT, root_label=ctx.root_label,
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
        mutation=write.site, saved=event.saved.site, root_label=ctx.root_label,
        confirmed=True if isinstance(event, StaleSavedTensorUsed) else None, severity=Severity.ERROR,
        cause=SideEffectCause.CHECKPOINT_INPUT,
    )
