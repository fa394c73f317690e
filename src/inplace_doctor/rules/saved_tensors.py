"""Rules about tensors autograd saved for backward and then saw overwritten."""

from __future__ import annotations

import re
from typing import Any

from ..events import InplaceErrorRaised, SavedTensorOverwritten, StaleSavedTensorUsed
from ..findings import Finding, Severity
from ..sites import Site
from .describe import fix_for_write, short_op, tensor_desc, where
from .registry import make_finding, rule

_PYTORCH_STALE = re.compile(r"modified by an inplace operation", re.IGNORECASE)
_STALE_DETAILS = re.compile(
    r"\[(?P<type>[\w.]+) \[(?P<shape>[^\]]*)\]\], which is (?:output \d+ of|saved by) (?P<node>\w+), "
    r"is at version (?P<now>\d+); expected version (?P<then>\d+)"
)


def _saved_phrase(event: SavedTensorOverwritten | StaleSavedTensorUsed, ctx: Any) -> str:
    saved = event.saved
    return f"`{saved.slot}` saved it for backward: {where(saved.site, ctx.root_label)}"


@rule(
    "IPD101",
    "saved-tensor-overwritten",
    "Tensor saved for backward is overwritten in place",
    Severity.ERROR,
    events=(SavedTensorOverwritten, StaleSavedTensorUsed, InplaceErrorRaised),
)
def saved_tensor_overwritten(event: Any, ctx: Any) -> Finding | None:
    """A tensor autograd saved for backward is overwritten by an in-place op; backward will raise.

    What: an op saved a tensor for its backward (``sigmoid`` saves its output,
    ``mm``/``conv`` save their inputs, ``sin``/``pow`` their input), and a later
    in-place op (``relu_``, ``+=``, ``x[i] = v``, an optimizer step) wrote to
    that tensor or a view of it, bumping its version counter.

    Why: when backward reaches the saving node, autograd compares versions and
    raises "one of the variables needed for gradient computation has been
    modified by an inplace operation" — naming neither line. inplace-doctor
    reports it at the write, before backward, with both lines. A tensor saved
    only by a branch that backward never reaches is reported unconfirmed
    (warning).

    Example::

        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)      # SigmoidBackward0 saves s
        s.mul_(2)                 # IPD101: overwrites s
        s.sum().backward()        # PyTorch raises here

    Fix: make the write out of place (``s = s * 2``), set the module's
    ``inplace=False``, or move the write (an optimizer step) after backward.
    Safe look-alikes: ``relu_`` after Linear/BatchNorm/Dropout/GELU, and
    ``x += f(x)`` where ``f`` saves nothing (``x * 2``, ``x + y``).
    """
    if isinstance(event, InplaceErrorRaised):
        return _from_pytorch_error(event, ctx)
    if isinstance(event, SavedTensorOverwritten):
        if not event.shares_version_counter or event.already_used_by_backward:
            return None  # IPD104's case; or it matters only if backward runs again (then it raises)
        if event.write.in_checkpoint and event.saved.is_checkpoint_input:
            return None  # a checkpointed region writing its own input: IPD108 explains it
        write, saved = event.write, event.saved
        confirmed: bool | None = None
    else:
        prior = ctx.overwrite_for(event.saved.key)
        if prior is not None and prior.write.in_checkpoint and prior.saved.is_checkpoint_input:
            return None
        if prior is None:
            return _stale_without_write(event, ctx)
        write, saved = prior.write, prior.saved
        confirmed = True
    node = saved.node or "its autograd node"
    why = (
        f"Backward will raise \"one of the variables needed for gradient computation has been modified by an "
        f"inplace operation\" when it reaches {node}: the tensor is at version {event.version_now}, autograd "
        f"saved version {saved.version}."
    )
    return make_finding(
        "IPD101",
        what=(
            f"{where(write.site, ctx.root_label)} overwrote {tensor_desc(write.shape, write.dtype)} that "
            f"{_saved_phrase_from(saved, ctx)}."
        ),
        why=why,
        fix=fix_for_write(write.site, ctx.root_label),
        mutation=write.site,
        saved=saved.site,
        confirmed=confirmed,
        slot=saved.slot,
        saved_version=saved.version,
        version_now=event.version_now,
    )


def _saved_phrase_from(saved: Any, ctx: Any) -> str:
    return f"`{saved.slot}` saved for backward ({where(saved.site, ctx.root_label)})"


def _stale_without_write(event: StaleSavedTensorUsed, ctx: Any) -> Finding:
    saved = event.saved
    return make_finding(
        "IPD101",
        what="",
        why=(
            f"Backward reached `{saved.slot}`, saved at {saved.site.location}, and found it overwritten: "
            f"version {event.version_now}, autograd saved version {saved.version}. The write happened "
            "outside the instrumented code (or before a second backward through a retained graph)."
        ),
        fix="find the in-place write to this tensor between its save and backward (run it inside watch(fail_fast=True))",
        mutation=Site(op="<unknown write>", phase="backward"),
        saved=saved.site,
        confirmed=True,
        slot=saved.slot,
    )


def _from_pytorch_error(event: InplaceErrorRaised, ctx: Any) -> Finding | None:
    text = str(event.error)
    if not _PYTORCH_STALE.search(text) or event.in_checkpoint:
        return None  # raised by a checkpoint's recompute: IPD108 explains it
    found = _STALE_DETAILS.search(text)
    what = f"`{found['node']}` saved a [{found['shape']}] tensor" if found else "a saved tensor"
    return make_finding(
        "IPD101",
        what="",
        why=(
            f"PyTorch raised at backward ({event.site.location}): {what} that was modified in place after it "
            "was saved. The save and the write happened outside inplace-doctor's view (before watch() began), "
            "so only PyTorch's own check saw it."
        ),
        fix="run the forward pass inside watch() too, so both the saving and the overwriting line are named",
        mutation=event.site,
        confirmed=True,
    )


@rule(
    "IPD104",
    "saved-tensor-silently-overwritten",
    "Saved tensor's memory overwritten behind autograd's back",
    Severity.ERROR,
    events=(SavedTensorOverwritten,),
)
def saved_tensor_silently_overwritten(event: SavedTensorOverwritten, ctx: Any) -> Finding | None:
    """A saved tensor's bytes are overwritten through an alias with its own version counter: silent wrong gradients.

    What: ``.data``, ``set_``, and tensors that share storage without sharing
    the version counter (``torch.from_numpy`` twins, ``untyped_storage()``
    views) write the memory of a tensor autograd saved, without bumping the
    saved tensor's version.

    Why: autograd cannot notice. Backward reads the new values and computes
    wrong gradients with no error at all. Severity error: this is the worst
    kind of in-place bug.

    Example::

        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)     # SigmoidBackward0 saves s
        s.data.mul_(0.5)         # IPD104: same storage, separate counter
        s.sum().backward()       # no error, wrong x.grad

    Fix: never write through ``.data``; modify a copy (``s.detach().clone()``)
    or do the write after backward (under ``torch.no_grad()`` for parameters).
    Writes the node's backward never reads (BatchNorm's running statistics in
    training mode) are not reported.
    """
    if event.shares_version_counter:
        return None
    write, saved = event.write, event.saved
    code = write.site.code or ""
    if not event.write_bumped_a_version:
        alias = f"with `{short_op(write.site.op)}`, which bumps no version counter at all"
    elif ".data" in code:
        alias = "through `.data`"
    else:
        alias = "through an alias that does not share its version counter"
    why = (
        f"Autograd cannot notice: the saved tensor's version stays {saved.version}, and backward will silently "
        "compute gradients from the new values."
    )
    if write.site.api and write.site.api.endswith(".step"):
        fix = fix_for_write(write.site, ctx.root_label)
    else:
        fix = (
            f"write into a copy (`t = t.detach().clone()`) at {write.site.location} instead of the saved "
            "tensor's memory, or make the write after backward"
        )
    return make_finding(
        "IPD104",
        what=(
            f"{where(write.site, ctx.root_label)} changed the memory of {tensor_desc(saved.shape, saved.dtype)} "
            f"that {_saved_phrase_from(saved, ctx)}, {alias}."
        ),
        why=why,
        fix=fix,
        mutation=write.site,
        saved=saved.site,
        slot=saved.slot,
        op=short_op(write.site.op),
    )
