"""Rules about data that code outside the model still holds."""

from __future__ import annotations

from typing import Any

from ..events import CallerInputWritten
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
