"""Rules about tensors autograd saved for backward and then saw overwritten.

Their sentences: render/explain/saved_tensors.py.
"""

from __future__ import annotations

import re

from ..causes import RaisedFacts, SavedTensorCause, SilentOverwriteCause, VersionFacts
from ..events import (
    InplaceErrorRaised,
    SavedInfo,
    SavedTensorOverwritten,
    SavedTensorReached,
    StaleSavedTensorUsed,
    WriteInfo,
)
from ..findings import Finding, Fix, Severity
from ..sites import Phase, Site
from ..trace.places.stacks import capture_frames, make_site
from ..trace.raised.pytorch_errors import is_stale_saved_tensor_error
from .fixes.fix_builders import silent_write_fixes, write_fixes
from .fixes.fix_moves import step_fixes
from .registry import RuleContext, make_finding, rule

# Over PyTorch's own error message (not over any text of ours): the saving node and shape it names.
_STALE_DETAILS = re.compile(
    r"\[(?P<type>[\w.]+) \[(?P<shape>[^\]]*)\]\], which is (?:output \d+ of|saved by) (?P<node>\w+), "
    r"is at version (?P<now>\d+); expected version (?P<then>\d+)"
)


@rule(
    "IPD101",
    "saved-tensor-overwritten",
    "Tensor saved for backward is overwritten in place",
    Severity.ERROR,
    events=(SavedTensorOverwritten, StaleSavedTensorUsed, InplaceErrorRaised),
)
def saved_tensor_overwritten(
    event: SavedTensorOverwritten | StaleSavedTensorUsed | InplaceErrorRaised, ctx: RuleContext
) -> Finding | None:
    """A tensor autograd saved for backward is overwritten by an in-place op; backward will raise.

    What: an op saved a tensor for its backward (``sigmoid`` saves its output,
    ``mm``/``conv`` save their inputs, ``sin``/``pow`` their input), and a later
    in-place op (``relu_``, ``+=``, ``x[i] = v``, an optimizer step) wrote to
    that tensor or a view of it, bumping its version counter. A write to
    another part of its base (``b[2].zero_()`` after ``b[0].sin()``) changes
    no saved element but bumps the counter the views share: PyTorch raises
    all the same, and the finding says that no saved element changed.

    Why: when backward reaches the saving node, autograd compares versions and
    raises "one of the variables needed for gradient computation has been
    modified by an inplace operation" — naming neither line. inplace-doctor
    records both lines at the write and reports an error when backward reaches
    the tensor (confirmed). A graph that is freed without backward reaching it
    (an RL target computed with grad and used detached) raises nothing in
    PyTorch, so nothing is reported; one still alive when the run ends is
    reported as info (in ``audit``: not on the loss's path).

    Example::

        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)      # SigmoidBackward0 saves s
        s.mul_(2)                 # IPD101: overwrites s
        s.sum().backward()        # PyTorch raises here

    Fix: make the write out of place (``s = s * 2``), set the module's
    ``inplace=False``, or move the write (an optimizer step) after backward
    (never a statement whose result the forward uses, never into another
    function). When that backward is a later run of a line above the step (a
    loop), moving cannot help: run the forward again inside the loop if it
    ran before it, or, if it runs inside, detach the state the loop carries
    into the next iteration's graph (``h = h.detach()`` after the step).
    Safe look-alikes: ``relu_`` after Linear/BatchNorm/Dropout/GELU, and
    ``x += f(x)`` where ``f`` saves nothing (``x * 2``, ``x + y``).

    Not seen: writes that bump no version counter (``.data``, ``set_``, fused
    kernels that skip the bump: IPD104; memory written through NumPy, DLPack
    or a pointer: IPD109); ops run by threads the watched code starts (they
    run untraced, and the report names them); lines inside TorchScript (the
    sites name the line that called it). ``torch.compile``d code is run
    eagerly while watched, and the finding says what the compiled program
    does instead.

    Mode: fast (the default) and deep: the fast tracer serves it (only writes and saves enter Python).
    """
    if isinstance(event, InplaceErrorRaised):
        return _from_pytorch_error(event, ctx)
    if isinstance(event, SavedTensorOverwritten):
        if not event.shares_version_counter:
            return None  # IPD104's case
        if event.write.in_checkpoint and event.saved.is_checkpoint_input:
            return None  # a checkpointed region writing its own input: IPD108 explains it
        write, saved, counter_only = event.write, event.saved, not event.saved_elements_written
        confirmed: bool | None = None
        backward = None
    else:
        prior = ctx.overwrite_for(event.saved.key)
        if prior is not None and prior.write.in_checkpoint and prior.saved.is_checkpoint_input:
            return None
        if prior is None:
            return _stale_without_write(event, ctx)
        write, saved, counter_only = prior.write, prior.saved, not prior.saved_elements_written
        if saved.node is None:  # named since the write (`h.mul_(h)`: its node's hook ran after it)
            saved = event.saved
        confirmed = True
        backward = backward_site()
    return make_finding(
        "IPD101",
        cause=SavedTensorCause.OVERWRITTEN,
        fixes=_fixes(write, backward, saved.site),
        mutation=write.site,
        saved=saved.site,
        confirmed=confirmed,
        slot=saved.slot,
        facts=_version_facts(write, saved, event.version_now, backward, counter_only),
        target=write.target,
        root_label=ctx.root_label,
    )


def _version_facts(
    write: WriteInfo, saved: SavedInfo, version_now: int | None, backward: Site | None, counter_only: bool = False
) -> VersionFacts:
    return VersionFacts(
        saved.version, version_now, node=saved.node, write_shape=write.shape, write_dtype=write.dtype,
        saved_shape=saved.shape, backward=backward, counter_only=counter_only,
    )


def _is_update(write: WriteInfo) -> bool:
    """An optimizer step or a write to a parameter or buffer: the program's intent, never dropped, ordered."""
    return bool((write.site.api and write.site.api.endswith(".step")) or write.target)


def _fixes(write: WriteInfo, backward: Site | None, saved: Site | None) -> tuple[Fix, ...]:
    if _is_update(write):
        return step_fixes(write.site, backward, saved)
    return write_fixes(write.site, saved)


def backward_site() -> Site | None:
    """The user's line that started the running backward (`loss.backward()`)."""
    frames, api = capture_frames()
    return make_site("backward", frames, api, None, "backward") if frames else None


def _stale_without_write(event: StaleSavedTensorUsed, ctx: RuleContext) -> Finding:
    saved = event.saved
    return make_finding(
        "IPD101",
        cause=SavedTensorCause.WRITE_NOT_SEEN,
        mutation=Site(op="<unknown write>", phase=Phase.BACKWARD),
        saved=saved.site,
        confirmed=True,
        slot=saved.slot,
        facts=VersionFacts(saved.version, event.version_now),
        root_label=ctx.root_label,
    )


def _from_pytorch_error(event: InplaceErrorRaised, ctx: RuleContext) -> Finding | None:
    text = str(event.error)
    if not is_stale_saved_tensor_error(text) or event.in_checkpoint:
        return None  # raised by a checkpoint's recompute: IPD108 explains it
    found = _STALE_DETAILS.search(text)
    return make_finding(
        "IPD101",
        cause=SavedTensorCause.RAISED_BEFORE_WATCH,
        mutation=event.site,
        confirmed=True,
        facts=RaisedFacts(
            text.strip().splitlines()[0] if text.strip() else type(event.error).__name__,
            node=found["node"] if found else None, shape=found["shape"] if found else None,
        ),
        root_label=ctx.root_label,
    )


@rule(
    "IPD104",
    "saved-tensor-silently-overwritten",
    "Saved tensor's memory overwritten behind autograd's back",
    Severity.ERROR,
    events=(SavedTensorOverwritten, SavedTensorReached),
)
def saved_tensor_silently_overwritten(
    event: SavedTensorOverwritten | SavedTensorReached, ctx: RuleContext
) -> Finding | None:
    """A saved tensor's bytes are overwritten through an alias with its own version counter: silent wrong gradients.

    What: ``.data``, ``set_``, and tensors that share storage without sharing
    the version counter (``torch.from_numpy`` twins, ``untyped_storage()``
    views) write the memory of a tensor autograd saved, without bumping the
    saved tensor's version.

    Why: autograd cannot notice. Backward reads the new values and computes
    wrong gradients with no error at all. Severity error, once backward has
    read the changed tensor (confirmed); a graph freed without backward reading
    it (a soft target-network update through ``.data`` while an unused graph
    is alive) is harmless and not reported.

    Example::

        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)     # SigmoidBackward0 saves s
        s.data.mul_(0.5)         # IPD104: same storage, separate counter
        s.sum().backward()       # no error, wrong x.grad

    Fix: make the write out of place on the tensor itself (``s = s.mul(0.5)``:
    autograd then sees it), or, if the new values must carry no gradient,
    compute them from a copy (``s.detach().clone()``) and use the copy; for a
    parameter, do the update after backward (under ``torch.no_grad()``).
    Writes the node's backward never reads (BatchNorm's running statistics in
    training mode) are not reported.

    Mode: fast (the default) and deep: the fast tracer serves it (only writes and saves enter Python).
    """
    if isinstance(event, SavedTensorReached):
        prior = ctx.overwrite_for(event.key)
        if prior is None or prior.shares_version_counter:
            return None
        event, confirmed = prior, True
    else:
        if event.shares_version_counter:
            return None
        confirmed = None
    write, saved = event.write, event.saved
    if not event.write_bumped_a_version:
        cause = SilentOverwriteCause.NO_VERSION_BUMP
    elif ".data" in (write.site.code or ""):
        cause = SilentOverwriteCause.DATA_ALIAS
    else:
        cause = SilentOverwriteCause.OTHER_ALIAS
    return make_finding(
        "IPD104",
        cause=cause,
        fixes=step_fixes(write.site, None) if _is_update(write) else silent_write_fixes(write.site),
        mutation=write.site,
        saved=saved.site,
        confirmed=confirmed,
        slot=saved.slot,
        facts=_version_facts(write, saved, None, None),
        target=write.target,
        root_label=ctx.root_label,
    )
