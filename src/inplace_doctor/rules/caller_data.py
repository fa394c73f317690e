"""Rules about data that code outside the model still holds."""

from __future__ import annotations

from typing import Any

from ..events import CallerInputWritten, HeldTensorOverwritten
from ..findings import Finding, Severity
from .describe import fix_for_write, tensor_desc, where
from .registry import make_finding, rule


@rule(
    "IPD106",
    "caller-input-overwritten",
    "Model overwrites a tensor its caller passed in",
    Severity.WARNING,
    events=(CallerInputWritten,),
)
def caller_input_overwritten(event: CallerInputWritten, ctx: Any) -> Finding | None:
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
        what=(
            f"{where(write.site, ctx.root_label)} wrote into {tensor_desc(write.shape, write.dtype)} that is "
            f"`{event.argument}` of the model call."
        ),
        why=(
            f"The caller's `{event.argument}` changes under it: any code that reads it after the call (another "
            "model, a metric, the next accumulation step) silently gets the modified values."
        ),
        fix=f"{fix_for_write(write.site, ctx.root_label)}, or clone the input at the top of forward (`x = x.clone()`)",
        mutation=write.site,
        argument=event.argument,
    )


@rule(
    "IPD107",
    "held-tensor-overwritten",
    "Tensor still held elsewhere is overwritten",
    Severity.WARNING,
    events=(HeldTensorOverwritten,),
)
def held_tensor_overwritten(event: HeldTensorOverwritten, ctx: Any) -> Finding | None:
    """A tensor handed out earlier and still held (a `state_dict()` entry) is overwritten in place.

    What: ``model.state_dict()`` returns aliases of the live parameters and
    buffers, not copies. Code that keeps the dict as a snapshot (``best =
    model.state_dict()`` to restore the best epoch, an EMA "copy", a
    before/after comparison) and then trains on sees every later write —
    optimizer steps, BatchNorm's running statistics — in its "snapshot".

    Why: nothing raises; restoring the "best" weights silently restores the
    latest ones. Severity warning: an alias kept on purpose (to watch live
    weights) is fine, which the tool cannot tell.

    What is seen: ``state_dict()`` entries still alive when a dispatch-visible
    write (an optimizer step, ``copy_``, an in-place op) changes their memory;
    a dict that is saved or deep-copied and then dropped is not reported.
    Not seen: writes without a dispatch-visible op (BatchNorm's running-stat
    update), and tensors a forward hook keeps (a hook runs after the module's
    own hooks; reading such a tensor later inside ``watch()`` is IPD105 when
    an ``inplace=True`` module overwrote it).

    Example::

        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 8)).sum().backward()
        best = model.state_dict()      # aliases, not a copy
        opt.step()                     # IPD107: best['weight'] changes too

    Fix: take a real snapshot: ``copy.deepcopy(model.state_dict())`` or
    ``{k: v.detach().clone() for k, v in model.state_dict().items()}``.
    """
    write = event.write
    return make_finding(
        "IPD107",
        what=(
            f"{where(write.site, ctx.root_label)} changed the memory of `{event.held}`, handed out at "
            f"{event.handed_out.location} and still held."
        ),
        why=(
            f"`{event.held}` (from {event.handed_out.location}) is an alias of the live tensor, not a copy: "
            "whatever keeps it as a snapshot now holds the new values, and nothing raises."
        ),
        fix=(
            f"take a real snapshot at {event.handed_out.location}: `copy.deepcopy(model.state_dict())` or "
            "`{k: v.detach().clone() for k, v in model.state_dict().items()}`"
        ),
        mutation=write.site,
        held=event.held,
        handed_out=event.handed_out.location,
    )
