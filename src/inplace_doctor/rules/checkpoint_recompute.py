"""A checkpointed region whose recompute computes other values than its forward: gradients silently wrong.

Its sentences: render/explain/checkpoint_recompute.py.
"""

from __future__ import annotations

from dataclasses import replace

from ..causes import RecomputeCause, RecomputeFacts
from ..events import CheckpointRecomputeDiffers
from ..findings import Finding, Severity
from .registry import RuleContext, make_finding, rule


@rule(
    "IPD111",
    "checkpoint-recompute-differs",
    "Checkpoint recompute differs from the forward",
    Severity.ERROR,
    events=(CheckpointRecomputeDiffers,),
)
def checkpoint_recompute_differs(event: CheckpointRecomputeDiffers, ctx: RuleContext) -> Finding | None:
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

    Severity: an error, except when the tracer sees no cause and the op ran on
    an accelerator with nondeterministic algorithms allowed (atomics may differ
    in the last bits): then a warning, which says how to tell the two apart.

    Not seen: the reentrant form (``use_reentrant=True``), selective
    checkpointing's cached ops (comparison stops at the first one), and ops
    after the last tensor the backward needs (the recompute stops early).

    Fix: keep ``preserve_rng_state=True`` (the default); run whatever changes
    state the region reads (``optimizer.step()``, an annealed scale, an EMA
    update) after ``backward()``, or give the region a copy (``.clone()``);
    move in-place state updates out of the region.
    """
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
