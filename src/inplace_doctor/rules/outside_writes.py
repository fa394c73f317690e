"""IPD109: a saved tensor's bytes written outside PyTorch (NumPy, DLPack, raw pointers, kernels).

Its sentences: render/explain/outside_writes.py.
"""

from __future__ import annotations

from dataclasses import replace

from ..causes import HandOutFacts, OutsideWriteCause
from ..events import SavedTensorChangedOutside
from ..findings import Finding, Fix, Severity
from ..sites import Phase, Site
from .fixes.fix_builders import copy_at_handout, pointer_handout
from .registry import RuleContext, make_finding, rule


@rule(
    "IPD109",
    "saved-tensor-changed-outside-pytorch",
    "Saved tensor's memory written outside PyTorch (NumPy, DLPack, pointer)",
    Severity.ERROR,
    events=(SavedTensorChangedOutside,),
)
def saved_tensor_changed_outside(event: SavedTensorChangedOutside, ctx: RuleContext) -> Finding | None:
    """A saved tensor's bytes change with no op at all: written through NumPy, DLPack or a raw pointer.

    What: ``t.numpy()`` (``t.detach().numpy()``), ``t.__dlpack__()`` (what
    ``np.from_dlpack(t)`` calls), ``t.__array__()`` (what ``np.asarray(t)``
    calls), ``torch.utils.dlpack.to_dlpack(t)`` and ``t.data_ptr()`` hand a
    tensor's memory to code PyTorch does not see. An
    in-place write there (``a *= 0.5``, ``a[0] = 0``, ``np.copyto(a, b)``, a
    ctypes ``memmove``, a C/CUDA kernel that mutates an input without declaring
    it) changes a tensor autograd saved for backward while no op runs.

    Why: no version counter moves, so autograd cannot notice: backward reads
    the new values and the gradients are silently wrong. IPD104 covers writes
    the dispatcher does see, through an alias with its own version counter
    (``.data``, ``set_``); here there is no op at all. inplace-doctor
    fingerprints the bytes of each saved tensor whose memory was handed out
    (every saved tensor with ``watch(check_contents=True)`` /
    ``--check-contents``, which also catches kernels) and compares at
    unpack: a change there is confirmed (backward read the new values). A
    change found when the session ends, before any backward read the tensor,
    is reported as info; a graph freed unread is harmless and not reported.
    The finding names the saving line and the hand-out line; with
    ``check_contents`` it also names the line that wrote (checked line by line
    in the frame that handed the memory out, the functions of yours it calls
    and its callers, for a bounded number of lines).
    ``audit`` names the writing line wherever it is: when its run found such a
    change without the line, it runs the model a second time (parameters,
    buffers, inputs and RNG state restored) and checks the changed tensor's
    bytes after each line of your code, NumPy's own frames left out.
    ``run`` cannot run a script's step twice, but a training step repeats
    itself: when a watched step found such a change without the line, the
    (at most two) watched steps after it check the tensors saved at the same place (same
    lines, shape and dtype) after each line of your code, and the finding
    names the line and the step it was found on (``--steps 1``: none
    follows, and the finding says so).

    What this rule does not see: the writing line under ``watch()`` without
    ``check_contents`` (a session knows no step boundary to search the next
    step from, and a trace function armed inside backward would run on
    autograd's thread; ``run --steps N`` does it), under ``run`` when no
    watched step follows the change or the later steps do not repeat the
    write, or past its line budget (the finding names the hand-out and says
    how the line was looked for); under ``audit``, a write that the
    second run does not repeat (it depends on state outside the model's
    parameters, buffers and RNG, such as a call counter, or runs in another
    thread): the finding says which. Writes to memory no saved tensor uses.
    A pointer taken by ``t.untyped_storage().data_ptr()``, by C++ code or
    before the session is no hand-out it sees: only ``check_contents`` finds
    that write.

    Example::

        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)          # SigmoidBackward0 saves s
        a = s.detach().numpy()        # shares s's memory
        a *= 0.5                      # IPD109: no op, no version bump
        s.sum().backward()            # no error, wrong x.grad

    Fix: give NumPy its own copy (``a = s.detach().numpy().copy()``, or
    ``s.detach().clone().numpy()``) and write that; or make the change in
    PyTorch on the tensor itself (``s = s * 0.5``) so autograd sees it; or do
    the write after backward. Reading the array (logging, metrics) is fine.

    Mode: fast (the default) and deep: the fast tracer serves it, with ``check_contents`` too: the fast
    tracer sees the hand-outs by wrapping those Tensor methods while it runs, and only saves on
    handed-out memory are fingerprinted (all of them with ``check_contents``).
    """
    saved, handed, write = event.saved, event.handed_out, event.write
    if write is not None and write.file:
        cause = OutsideWriteCause.WRITE_SEEN
    elif handed is not None:
        cause = OutsideWriteCause.HANDED_OUT
    else:
        cause = OutsideWriteCause.UNSEEN
    mutation = write if write is not None else handed if handed is not None else Site(
        op="<write outside PyTorch>", phase=Phase.FORWARD
    )
    facts = HandOutFacts(
        handed.location if handed is not None else None, event.how,
        in_source=handed is not None and bool(handed.file), code=handed.code or "" if handed is not None else "",
        shape=saved.shape, dtype=saved.dtype, saved_version=saved.version, node=saved.node, search=event.search,
        method=event.method, search_steps=event.search_steps,
    )
    fixes: tuple[Fix, ...] = ()
    if event.method is not None and event.method in COPIED_BY_METHOD:
        fixes = copy_at_handout(handed, event.method)
    elif event.method == "data_ptr":  # a pointer: the call it is passed to on that line wrote (a kernel's launch)
        launch, fixes = pointer_handout(handed)
        if launch is not None and cause is OutsideWriteCause.HANDED_OUT and handed is not None:
            mutation = replace(handed, op=launch)
    return make_finding(
        "IPD109",
        cause=cause,
        fixes=fixes,
        mutation=mutation,
        saved=saved.site,
        confirmed=True if event.reached else None,
        slot=saved.slot,
        facts=facts,
        root_label=ctx.root_label,
    )


#: hand-outs whose call a copy edit extends (`t.numpy()` -> `t.numpy().copy()`), by method
COPIED_BY_METHOD = frozenset({"numpy", "__dlpack__"})
