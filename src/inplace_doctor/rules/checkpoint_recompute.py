"""A checkpointed region whose recompute computes other values than its forward: gradients silently wrong.

Its sentences: render/explain/checkpoint_recompute.py.
"""

from __future__ import annotations

from dataclasses import replace

from ..causes import RecomputeCause, RecomputeFacts
from ..events import CheckpointRecomputeDiffers, CheckpointSavedBeforeWrite
from ..findings import Finding, Severity
from .registry import RuleContext, make_finding, rule


@rule(
    "IPD111",
    "checkpoint-recompute-differs",
    "Checkpoint recompute differs from the forward",
    Severity.ERROR,
    events=(CheckpointRecomputeDiffers, CheckpointSavedBeforeWrite),
)
def checkpoint_recompute_differs(
    event: CheckpointRecomputeDiffers | CheckpointSavedBeforeWrite, ctx: RuleContext
) -> Finding | None:
    """A checkpointed region's recompute produced other values than its forward did.

    What: ``torch.utils.checkpoint`` (non-reentrant, ``use_reentrant=False``)
    throws the region's activations away and recomputes them during backward.
    Each op the region runs leaves an exact fingerprint of its outputs in the
    forward; the recompute's ops are paired with the forward's by order, and
    the first op whose recomputed value differs is reported, with the likely
    cause: a random op (dropout's ``bernoulli_``, ``rand*``, ``normal_``) under
    ``preserve_rng_state=False``; a tensor the op reads from outside the region
    (a parameter, a buffer, a module's tensor attribute) written after the
    forward read it (the write is named); or the region's own in-place write
    to such state, run again by the recompute.

    Why: PyTorch checks only the recomputed tensors' shapes, dtypes and
    devices, not their values: backward uses the recomputed activations with
    the forward's graph, so the gradients are silently those of another
    computation (another dropout mask, another weight).

    Example::

        block = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
        x = torch.randn(4, 8, requires_grad=True)
        y = checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
        y.sum().backward()      # IPD111: the recompute's dropout draws another mask

    A kernel that writes an argument its backward saved before the kernel ran
    (``rrelu_with_noise``, the op of ``F.rrelu(x, training=True)`` and
    ``nn.RReLU`` in training mode, which draws its noise into the buffer it
    saved): with early stop (the default) the recompute stops once it has
    saved as many tensors as the forward did, so when that op's saves are the
    region's last, its kernel never runs again and backward reads the buffer
    as it was before the write (uninitialised memory for ``F.rrelu``): the
    output is bit-exact and the gradient silently wrong. The forward's written
    values are fingerprinted and compared with what the recompute saved; both
    lines are named, the op's and the ``checkpoint`` call's. Outside
    checkpoint, or when the kernel left the buffer as it was (eval mode), the
    saved buffer holds what backward needs, and nothing is said.

    Severity: an error, except when the tracer sees no cause and the op ran on
    an accelerator with nondeterministic algorithms allowed (atomics may differ
    in the last bits): then a warning, which says how to tell the two apart.

    Not seen: the reentrant form (``use_reentrant=True``, whose recompute
    runs the whole region and is right for ``F.rrelu``), selective
    checkpointing's cached ops (comparison stops at the first one), ops after
    the last tensor the backward needs (the recompute stops early), a
    recompute whose path differs from the forward's before the writing op,
    and kernels that write a saved argument without a write marker in their
    schema (BatchNorm's running statistics; none is known to save only
    before the kernel).

    Fix: keep ``preserve_rng_state=True`` (the default); run whatever changes
    state the region reads (``optimizer.step()``, an annealed scale, an EMA
    update) after ``backward()``, or give the region a copy (``.clone()``);
    move in-place state updates out of the region. For a kernel that writes
    what it saved: pass ``early_stop=False`` to ``checkpoint`` (the recompute
    then runs the region to its end, drawing the same noise with the
    preserved RNG state), or call ``F.rrelu``/``nn.RReLU`` outside the region.

    Mode: fast (the default) and deep: the fast tracer serves it (every op enters Python only while a
    checkpoint region's forward or recompute runs).
    """
    if isinstance(event, CheckpointSavedBeforeWrite):
        return _saved_before_write(event, ctx)
    write = event.changed_by
    if event.random and write is None:
        cause = RecomputeCause.RNG
    elif write is not None or event.input_version_changed:
        cause = RecomputeCause.STATE
    else:
        cause = RecomputeCause.UNKNOWN
    # Rounding is no error: a warning where the accelerator's kernels may differ in the last bits.
    rounding = cause is RecomputeCause.UNKNOWN and event.nondeterministic_kernels
    facts = RecomputeFacts(
        event.position, rng_preserved=event.rng_preserved, input_version_changed=event.input_version_changed,
        nondeterministic_kernels=event.nondeterministic_kernels,
    )
    if write is not None:
        facts = replace(
            facts, write=write.site, write_target=write.target, write_shape=write.shape, write_dtype=write.dtype,
            write_in_region=write.in_checkpoint,
        )
    return make_finding(
        "IPD111",
        cause=cause,
        mutation=event.site,
        severity=Severity.WARNING if rounding else None,
        facts=facts,
        root_label=ctx.root_label,
    )


def _saved_before_write(event: CheckpointSavedBeforeWrite, ctx: RuleContext) -> Finding:
    return make_finding(
        "IPD111",
        cause=RecomputeCause.SAVED_BEFORE_WRITE,
        mutation=event.site,
        saved=event.site,
        facts=RecomputeFacts(
            event.position, write_shape=event.shape, write_dtype=event.dtype, checkpoint_call=event.checkpoint_call,
            argument=event.argument, written_values=event.written, saved_values=event.saved,
            uninitialised=event.uninitialised, outside=event.outside,
        ),
        root_label=ctx.root_label,
    )
