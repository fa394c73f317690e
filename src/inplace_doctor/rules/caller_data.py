"""Rules about data that code outside the model still holds (their sentences: render/explain/caller_data.py)."""

from __future__ import annotations

from ..causes import ArgumentFacts, CallerDataCause, HeldFacts
from ..events import CallerInputWritten, HeldTensorOverwritten, HeldTensorUsed
from ..findings import Finding, Severity
from .fixes.fix_builders import copy_at_handout, write_fixes
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
    sees the modified values. PyTorch raises nothing. Writes to leaf tensors
    that require grad are IPD102 (PyTorch raises). In ``watch()``, the
    arguments of each call of an outermost module count as the caller's
    inputs, during that call; a model entered without ``nn.Module.__call__``
    (its class's own ``__call__``, a rollout; ``model.forward(x)`` called
    directly) counts as called (``trace/places/entry_points.py``), and ``audit(fn,
    x)`` of a function or callable object takes its arguments for the inputs.

    When it is reported: a write no flag asked for (``x += b``,
    ``x.clamp_()``, ``x[mask] = 0`` in a forward) at once. A write an
    ``inplace=True`` asked for (the running module's flag: a first-layer
    ``nn.ReLU(inplace=True)``, ``transforms.Normalize(..., inplace=True)``;
    or the argument of ``F.relu(x, inplace=True)``)
    only when the caller reads its tensor after the call, with that read's
    line: not when the call returns the written tensor as its result, nor
    when the caller no longer holds it (``model(x.clone())``, the fresh
    tensor ``ToTensor()`` made). ``audit()`` reports every write into its
    inputs: it does not see what the caller does afterwards.

    Not seen: a read after the call through a view the caller made before it
    (only the tensor object passed in is followed), and a read after the
    watched code ends; the first call of a model built before a ``watch()``
    not given it, entered without ``nn.Module.__call__`` (the report says so);
    under ``watch`` and ``run``, a plain function's writes into its arguments,
    which are the program's own.

    Example::

        model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
        x = torch.randn(4, 8)
        model(x)                   # IPD106: x now has no negative entries
        x_mean = x.mean()          # ... and the caller reads it again

    Fix: make that op out of place (``inplace=False``), or clone the input at
    the top of ``forward`` (``x = x.clone()``) if in-place is wanted inside.

    Mode: fast (the default) and deep: the fast tracer serves it (while a write an ``inplace=True`` asked
    for awaits the caller's read, every op enters Python only inside a call handed that tensor,
    TorchScript calls too). Not seen in fast mode: a read by a call not handed the tensor itself
    (one reaching it through a closure or an attribute).
    """
    write = event.write
    return make_finding(
        "IPD106",
        cause=CallerDataCause.CALLER_INPUT,
        fixes=write_fixes(write.site),
        mutation=write.site,
        read=event.read,
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
    in-place updates — in its "snapshot", and loading, saving or copying it
    uses the new values.

    Why: nothing raises; restoring the "best" weights silently restores the
    latest ones. Reported as a warning naming the write (where the live
    tensor changed), the use, and where the dict was handed out, when the
    overwritten alias is used as a snapshot: read together with its live
    tensor (``model.load_state_dict(best)``, a before/after comparison), or
    copied (``clone``, ``.detach().clone()``, ``copy_`` into another tensor
    as ``other.load_state_dict(best)`` does, ``.to()`` another device,
    ``copy.deepcopy``, ``torch.save``). An alias overwritten and still held
    but not used that way in the watched code is reported as info.

    Not reported: a write through the alias itself (an EMA updating its own
    ``state_dict()`` values with ``copy_`` or ``torch._foreach_lerp_``), the
    holder's intent; a stale alias read by arithmetic (an EMA's source dict
    kept as a live view and read into the EMA weights each step, as BigGAN's
    ``ema`` does), which makes its whole dict a live view: copies out of it
    afterwards are not reported either. A dict kept on purpose as a live view
    but only ever copied (``target.load_state_dict(live)``) is reported like a
    snapshot: call ``state_dict()`` where the copy is made.

    What is seen: ``state_dict()`` entries still alive when a dispatch-visible
    write changes their memory, and their ``.detach()``/``.data``; not seen:
    writes without a dispatch-visible op (BatchNorm's running-stat update),
    copies through other paths (``.numpy()``, ``pickle``, a ``torch.save``
    imported before watching as ``from torch import save``), and tensors a
    forward hook keeps.

    Example::

        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 8)).sum().backward()
        best = model.state_dict()      # aliases, not a copy
        opt.step()                     # best['weight'] changes too
        model.load_state_dict(best)    # IPD107: "restores" the stepped weights

    Fix: take a real snapshot: ``copy.deepcopy(model.state_dict())`` or
    ``{k: v.detach().clone() for k, v in model.state_dict().items()}``.

    Mode: fast (the default) and deep: the fast tracer serves it (every op enters Python only while a stale
    alias awaits its use).
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
