"""Rules about data that code outside the model still holds."""

from __future__ import annotations

import re

from ..causes import ArgumentFacts, CallerDataCause, HeldFacts
from ..events import CallerInputWritten, HeldTensorOverwritten, HeldTensorUsed
from ..findings import Finding, Severity
from .fix_builders import copy_at_handout, write_fixes
from .phrasing import fix_for_write, tensor_desc, where
from .registry import RuleContext, make_finding, rule


@rule(
    "IPD106",
    "caller-input-overwritten",
    "Model overwrites a tensor its caller passed in",
    Severity.WARNING,
    events=(CallerInputWritten,),
)
def caller_input_overwritten(event: CallerInputWritten, ctx: RuleContext) -> Finding | None:
    """The model writes in place into a tensor the caller passed in (an input batch, a mask, a target).

    What: an in-place op inside the model's forward (a first-layer
    ``nn.ReLU(inplace=True)``, ``x[mask] = 0``, ``x += bias``, ``x.clamp_()``)
    writes into the memory of an argument of the model call.

    Why: the caller's tensor changes under it. Code that uses the batch
    again — a second model, a metric, a logged image, the next gradient
    accumulation step, a dataset that hands out the same tensor — silently
    sees the modified values. PyTorch raises nothing. Severity warning: it is
    a bug only if the caller reads the tensor again, which the tool cannot
    know; writes to leaf tensors that require grad are IPD102 (PyTorch raises).
    In ``watch()``, the arguments of each call of an outermost module count
    as the caller's inputs, during that call.

    Example::

        model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
        x = torch.randn(4, 8)
        model(x)                   # IPD106: x now has no negative entries

    Fix: make that op out of place (``inplace=False``), or clone the input at
    the top of ``forward`` (``x = x.clone()``) if in-place is wanted inside.

    Mode: fast and deep: ``watch(deep=False)`` serves it (only writes and saves enter Python).
    """
    write = event.write
    return make_finding(
        "IPD106",
        cause=CallerDataCause.CALLER_INPUT,
        what=(
            f"{where(write.site, ctx.root_label)} wrote into {tensor_desc(write.shape, write.dtype)} that is "
            f"`{event.argument}` of the model call."
        ),
        why=(
            f"The caller's `{event.argument}` changes under it: any code that reads it after the call (another "
            "model, a metric, the next accumulation step) silently gets the modified values."
        ),
        fix=f"{fix_for_write(write.site, ctx.root_label)}, or clone the input at the top of forward (`x = x.clone()`)",
        fixes=write_fixes(write.site),
        mutation=write.site,
        facts=ArgumentFacts(event.argument),
    )


@rule(
    "IPD107",
    "held-tensor-overwritten",
    "Tensor still held elsewhere is overwritten",
    Severity.WARNING,
    events=(HeldTensorUsed, HeldTensorOverwritten),
)
def held_tensor_overwritten(event: HeldTensorUsed | HeldTensorOverwritten, ctx: RuleContext) -> Finding | None:
    """A `state_dict()` entry kept as a snapshot is used after another path overwrote it.

    What: ``model.state_dict()`` returns aliases of the live parameters and
    buffers, not copies. Code that keeps the dict as a snapshot (``best =
    model.state_dict()`` to restore the best epoch, a before/after
    comparison) and then trains on sees every later write — optimizer steps,
    in-place updates — in its "snapshot", and loading or comparing it uses the
    new values.

    Why: nothing raises; restoring the "best" weights silently restores the
    latest ones. Reported when the overwritten alias is used (read by an op:
    ``load_state_dict``, a comparison, a copy); an alias overwritten and still
    held but not used in the watched code is reported as info. A write through
    the alias itself (an EMA updating its own ``state_dict()`` values with
    ``copy_`` or ``torch._foreach_lerp_``) is the holder's intent and is not
    reported.

    What is seen: ``state_dict()`` entries still alive when a dispatch-visible
    write changes their memory; not seen: writes without a dispatch-visible op
    (BatchNorm's running-stat update), ``torch.save`` (it reads storages
    directly), and tensors a forward hook keeps.

    Example::

        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 8)).sum().backward()
        best = model.state_dict()      # aliases, not a copy
        opt.step()                     # best['weight'] changes too
        model.load_state_dict(best)    # IPD107: "restores" the stepped weights

    Fix: take a real snapshot: ``copy.deepcopy(model.state_dict())`` or
    ``{k: v.detach().clone() for k, v in model.state_dict().items()}``.

    Mode: fast and deep: ``watch(deep=False)`` serves it (every op enters Python only while a stale
    alias awaits its use).
    """
    used = event if isinstance(event, HeldTensorUsed) else None
    overwritten = used.overwritten if used is not None else event
    assert isinstance(overwritten, HeldTensorOverwritten)
    write = overwritten.write
    held, handed_out = overwritten.held, overwritten.handed_out.location
    if used is not None:
        what = (
            f"{where(write.site, ctx.root_label)} changed the memory of `{held}`, handed out at {handed_out}; "
            f"then {where(used.use, ctx.root_label)} used it ({used.how})."
        )
        why = (
            f"`{held}` is an alias of the live tensor, not a copy: what was used as a snapshot held the new "
            "values, and nothing raises."
        )
    else:
        what = (
            f"{where(write.site, ctx.root_label)} changed the memory of `{held}`, handed out at {handed_out} and "
            "still held; the watched code did not use it afterwards."
        )
        why = (
            f"`{held}` is an alias of the live tensor, not a copy: if it is meant as a snapshot, loading, saving "
            "or comparing it later uses the new values."
        )
    owner = _state_dict_owner(overwritten.handed_out.code)
    return make_finding(
        "IPD107",
        cause=CallerDataCause.HELD_ALIAS_USED if used is not None else CallerDataCause.HELD_ALIAS_OVERWRITTEN,
        what=what,
        why=why,
        fix=(
            f"take a real snapshot at {handed_out}: `copy.deepcopy({owner}.state_dict())` or "
            f"`{{k: v.detach().clone() for k, v in {owner}.state_dict().items()}}`"
        ),
        fixes=copy_at_handout(overwritten.handed_out, "state_dict"),
        mutation=write.site,
        read=used.use if used is not None else None,
        severity=None if used is not None else Severity.INFO,
        facts=HeldFacts(held, handed_out),
    )


# Over the user's source line (`best = model.state_dict()`), not over any text of ours.
_STATE_DICT_CALL = re.compile(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])*)\.state_dict\(\)")


def _state_dict_owner(code: str | None) -> str:
    """The expression whose `state_dict()` the handing-out line called (`D`, `self.net`), for the fix
    the user pastes there; `model` when the line does not show one."""
    found = _STATE_DICT_CALL.search(code or "")
    return found.group(1) if found else "model"
