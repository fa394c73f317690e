"""IPD109: a saved tensor's bytes written outside PyTorch (NumPy, DLPack, raw pointers, kernels)."""

from __future__ import annotations

import re

from ..causes import HandOutFacts, OutsideWriteCause
from ..events import SavedTensorChangedOutside, WriteLineSearch
from ..findings import Finding, Severity
from ..sites import Phase, Site
from .fix_builders import copy_at_handout
from .phrasing import tensor_desc, where, without_comment
from .registry import RuleContext, make_finding, rule

# Over the user's source line, not over any text of ours. `a = t.detach().numpy()`, `arr = np.from_dlpack(t)`: the hand-out, assigned to a name
_ASSIGNED = re.compile(r"^(?P<target>[\w.]+)\s*=\s*(?P<value>.+?)\s*$")


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
    ``np.from_dlpack(t)`` calls), ``torch.utils.dlpack.to_dlpack(t)`` and
    ``t.data_ptr()`` hand a tensor's memory to code PyTorch does not see. An
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

    What this rule does not see: the writing line under ``watch()`` and
    ``run`` without ``check_contents``, or past its line budget (the program
    cannot be run twice: the finding names the hand-out and says how the
    line was looked for); under ``audit``, a write that the
    second run does not repeat (it depends on state outside the model's
    parameters, buffers and RNG, such as a call counter, or runs in another
    thread): the finding says which. Writes to memory no saved tensor uses.

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

    Mode: deep: it needs the hand-out calls (``.numpy()``, DLPack, ``data_ptr()``) and content
    checks, which the fast tracer does not watch; ``watch(deep=False)`` selecting it runs deep.
    """
    saved = event.saved
    handed, how = event.handed_out, event.how or "a hand-out of its memory"
    write = event.write
    desc = tensor_desc(saved.shape, saved.dtype)
    saving = f"`{saved.slot}` saved for backward ({where(saved.site, ctx.root_label)})"
    through = f" through memory handed out by {how} at {handed.location}" if handed is not None and handed.file else ""
    node = saved.node or "its autograd node"
    if write is not None and write.file:
        cause = OutsideWriteCause.WRITE_SEEN
        what = f"`{without_comment(write.code or '')}` at {write.location} changed the bytes of {desc}, {saving},{through}"
        if event.search is WriteLineSearch.LINE:
            what += f" ({_found_by_replay()})"
    elif handed is not None:
        cause = OutsideWriteCause.HANDED_OUT
        what = f"The bytes of {desc}, {saving}, changed{through}, with no PyTorch op ({_line_not_named(event.search)})"
    else:
        cause = OutsideWriteCause.UNSEEN
        what = (
            f"The bytes of {desc}, {saving}, changed with no PyTorch op and no hand-out of its memory seen "
            "(a C/CUDA extension kernel that writes an input without declaring it, or a pointer taken before "
            f"the session; {_line_not_named(event.search)})"
        )
    version = f"the saved tensor's version stayed {saved.version}"
    if event.reached:
        why = (
            f"No op ran and no version counter moved ({version}): backward read the new values at {node} with no "
            "error, so the gradients it computed from them are silently wrong."
        )
    else:
        why = (
            f"No op ran and no version counter moved ({version}): a backward that reaches {node} will silently "
            "compute gradients from the new values. A graph freed without such a backward is harmless."
        )
    mutation = write if write is not None else handed if handed is not None else Site(
        op="<write outside PyTorch>", phase=Phase.FORWARD
    )
    return make_finding(
        "IPD109",
        cause=cause,
        what=what + ".",
        why=why,
        fix=_fix(handed, how, write),
        fixes=copy_at_handout(handed, _HANDED_BY[how]) if how in _HANDED_BY else (),
        mutation=mutation,
        saved=saved.site,
        confirmed=True if event.reached else None,
        slot=saved.slot,
        facts=HandOutFacts(handed.location if handed is not None else None, event.how),
    )


_HANDED_BY = {"`.numpy()`": "numpy", "`__dlpack__()`": "__dlpack__"}  # the method a copy edit appends to


def _fix(handed: Site | None, how: str, write: Site | None) -> str:
    tail = (
        "the array then owns its memory and the saved tensor keeps its values; to change the tensor itself, "
        "do it in PyTorch (`s = s * 0.5`) so autograd sees it, or after backward"
    )
    if (handed is None or not handed.file) and write is not None and write.file:
        return (
            f"give the code at {write.location} a copy of the tensor (`t.detach().clone()`) to write, or declare "
            f"the kernel's write: {tail}"
        )
    if handed is None or not handed.file:
        return (
            "find the code that writes this tensor's memory outside PyTorch (NumPy, DLPack, a pointer, an "
            "extension kernel) and give it a copy (`t.detach().clone()`), or declare the kernel's write"
        )
    code = without_comment(handed.code or "")
    assigned = _ASSIGNED.match(code)
    if assigned and how in ("`.numpy()`", "`__dlpack__()`") and not assigned["value"].endswith(".copy()"):
        value = assigned["value"]
        return f"replace `{code}` with `{assigned['target']} = {value}.copy()` at {handed.location}: {tail}"
    return f"hand out a copy at {handed.location} (`t.detach().clone()` before {how}): {tail}"


def _found_by_replay() -> str:
    return "found by running the model a second time, state restored, and checking the bytes after each line of your code"


def _line_not_named(search: WriteLineSearch) -> str:
    """Why the writing line is not named: how it was looked for, and what kept the search from it."""
    replay = "a second run of the model, to find the writing line,"
    reasons = {
        WriteLineSearch.NOT_SEARCHED: (
            "the writing line was not looked for: `ipd.audit(model, x)` of the model that writes runs it a second "
            "time and names the line; `check_contents=True` checks the lines after the hand-out"
        ),
        WriteLineSearch.HANDOUT_FRAME: (
            "the lines after the hand-out, in its frame, were checked and none changed the bytes: the write ran "
            "elsewhere; `ipd.audit(model, x)` of the model that writes runs it a second time and checks every line"
        ),
        WriteLineSearch.NOT_SAVED_AGAIN: f"the writing line is not named: {replay} saved no tensor at this place, "
        "so the run does not repeat",
        WriteLineSearch.OTHER_BYTES: f"the writing line is not named: {replay} saved this tensor with other bytes, "
        "so the run is not deterministic (random draws the RNG state does not cover, or state the first run changed)",
        WriteLineSearch.NO_CHANGE: f"the writing line is not named: {replay} saved the same bytes, and no line of your "
        "code changed them (the write may depend on state the first run changed, or run in another thread)",
        WriteLineSearch.BUDGET: f"the writing line is not named: {replay} ran out of its line budget before the change",
        WriteLineSearch.TRACED: "the writing line is not named: another trace function (a debugger, coverage) was "
        "active, so a second run could not check the lines",
        WriteLineSearch.FAILED: f"the writing line is not named: {replay} raised before it saved this tensor, so the run does "
        "not repeat",
    }
    return reasons.get(search, reasons[WriteLineSearch.NOT_SEARCHED])
