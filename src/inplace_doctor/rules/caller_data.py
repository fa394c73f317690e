"""Rules about data that code outside the model still holds (their sentences: render/explain/caller_data.py)."""

from __future__ import annotations

from ..causes import ArgumentFacts, CallerDataCause, HeldFacts
from ..events import CallerInputWritten, HeldTensorOverwritten, HeldTensorUsed
from ..findings import Finding, Severity
from .fix_builders import copy_at_handout, write_fixes
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
    """
    write = event.write
    return make_finding(
        "IPD106",
        cause=CallerDataCause.CALLER_INPUT,
        fixes=write_fixes(write.site),
        mutation=write.site,
        facts=ArgumentFacts(event.argument, shape=write.shape, dtype=write.dtype),
        root_label=ctx.root_label,
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
    """
    used = event if isinstance(event, HeldTensorUsed) else None
    overwritten = used.overwritten if used is not None else event
    assert isinstance(overwritten, HeldTensorOverwritten)
    write = overwritten.write
    handed_out = overwritten.handed_out
    return make_finding(
        "IPD107",
        cause=CallerDataCause.HELD_ALIAS_USED if used is not None else CallerDataCause.HELD_ALIAS_OVERWRITTEN,
        fixes=copy_at_handout(handed_out, "state_dict"),
        mutation=write.site,
        read=used.use if used is not None else None,
        severity=None if used is not None else Severity.INFO,
        facts=HeldFacts(
            overwritten.held, handed_out.location, code=handed_out.code or "", used_how=used.how if used is not None else ""
        ),
        root_label=ctx.root_label,
    )
