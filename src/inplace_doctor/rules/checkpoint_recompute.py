"""A checkpointed region whose recompute computes other values than its forward: gradients silently wrong."""

from __future__ import annotations

from ..causes import RecomputeCause, RecomputeFacts
from ..events import CheckpointRecomputeDiffers, CheckpointSavedBeforeWrite
from ..findings import Finding, Severity
from .phrasing import qualified, tensor_desc, where
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

    Mode: deep: it compares a checkpoint's recompute with its forward op by op, which only the
    per-op tracer sees; ``watch(deep=False)`` selecting it runs deep.
    """
    if isinstance(event, CheckpointSavedBeforeWrite):
        return _saved_before_write(event, ctx)
    site = event.site
    place = where(site, ctx.root_label)
    write = event.changed_by
    first = f"the {_ordinal(event.position)} op of the region"
    severity = None  # the rule's: an error
    what = f"The checkpoint's recompute of {place} ({first}) produced other values than its forward did."
    if event.random and write is None:
        if event.rng_preserved is False:
            cause = (
                f"`{site.op}` draws random numbers and the region runs with preserve_rng_state=False: "
                "the recompute draws other ones (another dropout mask)."
            )
            fix = "pass preserve_rng_state=True to checkpoint (the default), or move the random op out of the region"
        else:
            cause = (
                f"`{site.op}` draws random numbers, and the generator was not in the same state for the "
                "recompute (another device's or a custom generator, which checkpoint does not restore)."
            )
            fix = "draw the random numbers outside the region and pass them in, or use the default generator"
    elif write is not None:
        target = qualified(write.target, ctx.root_label) if write.target else tensor_desc(write.shape, write.dtype)
        written_at = where(write.site, ctx.root_label)
        if write.in_checkpoint:
            cause = (
                f"It reads {target}, which the region itself writes in place ({written_at}): the recompute ran "
                "that write again and read the new value."
            )
            fix = "move the in-place update out of the checkpointed region, or make it out of place"
        else:
            cause = (
                f"It reads {target}, which {written_at} wrote after the forward read it: the recompute read "
                "the new value."
            )
            fix = (
                "make that write after backward() (or give the region a copy: `.clone()` what it reads), so "
                "the state the region reads is the same in forward and recompute"
            )
    elif event.input_version_changed:
        cause = "A tensor it reads from outside the region was modified in place after the forward read it."
        fix = "make that change after backward(), or give the region a copy of what it reads"
    elif event.nondeterministic_kernels:
        # No cause the tracer sees, on a device whose kernels may differ in the last bits run to run:
        # the gradients may differ from the forward's only by rounding, which is no error.
        cause = (
            "Its inputs from earlier ops of the region matched, and it ran on an accelerator with "
            "nondeterministic algorithms allowed: atomics (index_add_, scatter_add_, some convolution and "
            "matmul algorithms) can differ in the last bits from run to run, and then the gradients differ "
            "from the forward's only by rounding. Not certain either way: a tensor it reads may also have "
            "changed without a write the tracer sees (`.data` through numpy, another process)."
        )
        fix = (
            "run once with torch.use_deterministic_algorithms(True): if the finding stays, the values really "
            "changed; if it goes, it was the kernel's rounding"
        )
        severity = Severity.WARNING
    else:
        cause = (
            "Its inputs from earlier ops of the region matched: the kernel is nondeterministic, or a tensor it "
            "reads changed without a write the tracer sees (`.data` through numpy, another process)."
        )
        fix = "make the op deterministic (torch.use_deterministic_algorithms), or do not checkpoint it"
    return make_finding(
        "IPD111",
        cause=(
            RecomputeCause.RNG if event.random and write is None
            else RecomputeCause.STATE if write or event.input_version_changed else RecomputeCause.UNKNOWN
        ),
        what=what,
        why=(
            f"{cause} PyTorch checks only the recomputed shapes, dtypes and devices, not the values: backward "
            "uses the recomputed activations, so the gradients are silently those of another computation."
        ),
        fix=fix,
        mutation=site,
        severity=severity,
        facts=RecomputeFacts(event.position),
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _saved_before_write(event: CheckpointSavedBeforeWrite, ctx: RuleContext) -> Finding:
    site = event.site
    call = where(event.checkpoint_call, ctx.root_label) if event.checkpoint_call else "the `checkpoint` call"
    return make_finding(
        "IPD111",
        cause=RecomputeCause.SAVED_BEFORE_WRITE,
        what=_saved_before_write_what(event, where(site, ctx.root_label), call),
        why=_saved_before_write_why(event),
        fix=_saved_before_write_fix(call),
        mutation=site,
        saved=site,
        facts=RecomputeFacts(event.position),
    )


def _values(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:.4g}" for v in values) + ", ..." if values else "..."


def _saved_before_write_what(event: CheckpointSavedBeforeWrite, place: str, call: str) -> str:
    return (
        f"{place} (the {_ordinal(event.position)} op of the region checkpointed by {call}) writes its argument "
        f"`{event.argument}` ({tensor_desc(event.shape, event.dtype)}) after autograd saved it for backward. "
        f"The checkpoint's recompute stopped before that write: backward read `{event.argument}` as the "
        f"recompute saved it ({_values(event.saved)}), not the values the forward wrote "
        f"({_values(event.written)})."
    )


def _saved_before_write_why(event: CheckpointSavedBeforeWrite) -> str:
    return (
        "Non-reentrant checkpoint with early stop (the default) ends the recompute as soon as it has saved as "
        "many tensors as the forward did; this op's own input saves are the region's last, so its kernel does "
        f"not run again and {_saved_value(event)}. PyTorch checks only the recomputed shapes, dtypes and "
        "devices: the forward output is bit-exact while the gradients are silently wrong."
    )


def _saved_value(event: CheckpointSavedBeforeWrite) -> str:
    if event.outside:
        return (
            f"`{event.argument}`, a tensor from outside the region, is saved as it is at backward: written "
            "again since the forward wrote it"
        )
    if event.uninitialised:
        return f"`{event.argument}` keeps its value from before the write: uninitialised memory (`empty_like`)"
    return f"`{event.argument}` keeps the value the region gave it before the write"


def _saved_before_write_fix(call: str) -> str:
    return (
        f"pass early_stop=False to {call} (the recompute then runs the region to its "
        "end and, with preserve_rng_state=True, the default, writes the same values again), or move the op "
        "(F.rrelu, nn.RReLU) out of the checkpointed region"
    )
