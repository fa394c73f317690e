"""The English of a fix, made from its `Fix` record: what the edits change, where, and why it helps.

A rule decides which fixes a finding has (`Finding.fixes`, built by
`rules/fixes/fix_builders.py`); this module only says them. Each sentence is read
from the record's kind, its edits (path, range, old and new text) and the
finding's sites, never from another sentence. The finding's own `fix` (its
message, the error `fail_fast` raises) is `said` here too, so every output says
the same fix; only a finding no record speaks for has words of its explainer's.
"""

from __future__ import annotations

import ast
import linecache

from .._parsing import parse, parse_expression
from ..causes import ForbiddenCause
from ..findings import Applicability, Edit, Finding, Fix, FixKind
from ..sites import Frame, Site, module_ref
from .code_text import moved_code, one_line, without_comment


def fix_lines(finding: Finding, root_label: str) -> list[str]:
    """The finding's fix lines: one per `Fix` (alternatives after the first start with "or"); a
    proven one says so. Empty when no record says more (the rule's own sentence is printed then)."""
    said = [(fix, text) for fix in finding.fixes if (text := sentence(fix, finding, root_label))]
    return [f"{'fix' if i == 0 else 'or'}: {text}{_trust(fix)}" for i, (fix, text) in enumerate(said)]


def said(finding: Finding, root_label: str) -> str:
    """The finding's fixes as one sentence, alternatives joined by "; or ": `Finding.fix` (the message,
    the error `fail_fast` raises) says what `fix_lines` prints. "" when no record says one."""
    return "; or ".join(text for fix in finding.fixes if (text := sentence(fix, finding, root_label)))


def _trust(fix: Fix) -> str:
    if fix.applicability is Applicability.PROVEN:
        return " (proven on this program: `inplace-doctor fix` applies it)"
    return ""


def _line(edit: Edit, number: int) -> str:
    """Line `number` of the edit's file as its builder read it (the file may have changed since:
    `fix` edits it), else as linecache has it now."""
    return edit.line(number) or linecache.getline(edit.path, number)


def _statement(edit: Edit) -> str:
    """The source line an edit starts on, without its comment, as the fix's builder read it."""
    return without_comment(_line(edit, edit.start.line).strip())


def sentence(fix: Fix, finding: Finding, root_label: str) -> str:
    """What `fix` does, in words; "" when the record alone cannot say it."""
    edit = fix.edits[0] if fix.edits else None
    maker = _EDITED.get(fix.kind) if edit is not None else _MANUAL.get(fix.kind)
    text = maker(fix, finding, root_label) if maker is not None else ""
    if text and finding.code == "IPD106":  # the caller's tensor: a copy made where the model gets it helps too
        text += ", or clone the input at the top of forward (`x = x.clone()`)"
    if text and finding.cause is ForbiddenCause.MULTIPLE_VIEWS and edit is not None:
        text = several_views(_piece(fix, edit) or text)
    return text


def several_views(piece: str) -> str:
    """The fix of a write into one of several views returned together (IPD103), around the fix of the
    piece alone: which tensor was meant to change is the program's, so both choices are named. A
    `.clone()` of the piece, written, changes neither: the write is lost."""
    return (
        f"decide which tensor is meant to change. Only this piece: {piece} (the tensor it came from keeps its "
        "old values). The tensor it came from too: write into that tensor by index, one piece at a time "
        "(`t[i] = t[i].op(...)` instead of the views), or build it out of place (`torch.stack`/`torch.cat` of "
        "the changed pieces). Writing a `.clone()` of the piece changes neither: the write is lost"
    )


def _piece(fix: Fix, edit: Edit) -> str:
    """The piece's own fix: rebound out of place, or the out-of-place op where its result is used."""
    if fix.kind is FixKind.REBIND:
        return f"rebind it out of place: replace `{one_line(edit.old)}` with `{one_line(edit.new)}` at {_at(edit)}"
    if fix.kind is not FixKind.OUT_OF_PLACE:
        return ""
    receiver = _receiver(edit.old)
    kept = f" (`{receiver}` itself then keeps its old values)" if receiver else ""
    return (
        f"use the out-of-place op where its result is used: replace `{one_line(edit.old)}` with "
        f"`{one_line(edit.new)}` at {_at(edit)}{kept}"
    )


def _receiver(code: str) -> str | None:
    """`x` of the method call `x.clamp_(-1, 1)` (the edit's own old text)."""
    try:
        node = parse_expression(code.strip())
    except SyntaxError:
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return ast.unparse(node.func.value)
    return None


def _at(edit: Edit) -> str:
    return Frame(edit.path, edit.start.line, "").location


def _clone(fix: Fix, finding: Finding, root_label: str) -> str:
    edit = fix.edits[0]
    inserted = edit.new.strip()
    statement = _statement(edit) or "the write"
    m = finding.mutation
    if (m.file, m.line) != (edit.path, edit.start.line) and m.stack:
        helper = m.stack[-1]
        return (
            f"`{helper.function}` writes into its argument ({m.location}), so its caller may rely on the change: "
            f"keep it, and give it a copy the saved graph does not hold: insert `{inserted}` before `{statement}` "
            f"at {_at(edit)}"
        )
    if finding.code == "IPD109":  # memory written outside PyTorch (a kernel launched on a pointer)
        return (
            f"let it write a copy: insert `{inserted}` before `{statement}` at {_at(edit)} (the rest of your "
            "program reads the written copy; the tensor autograd saved keeps its values), or hand the kernel a "
            "fresh output buffer (`torch.empty_like(...)`) to write"
        )
    return f"write into a copy (`{inserted}` before `{statement}`) or build the result out of place (torch.where) at {_at(edit)}"


def _compute_then_write(fix: Fix, finding: Finding, root_label: str) -> str:
    edit = fix.edits[0]
    return (
        f"compute the value first, then write it into a copy: replace `{one_line(edit.old)}` with "
        f"`{one_line(edit.new)}` at {_at(edit)}. The value is computed from the tensor this statement writes, "
        "so a copy made before the statement would be read and written alike and change nothing"
    )


def _replace(fix: Fix, finding: Finding, root_label: str) -> str:
    edit = fix.edits[0]
    head = f"use the out-of-place `{_method(edit.new)}` and rebind the name: " if fix.kind is FixKind.REBIND else ""
    tail = ""
    if finding.code == "IPD110":
        tail = f", so autograd records the change; {cut_history(_assigned(edit.new))}"
    elif finding.code == "IPD104" and ".data" in edit.old:
        tail = (
            ": autograd then differentiates through the change; if the new values must carry no gradient, "
            "compute them from a detached copy (`t.detach().clone()`) and use the copy instead"
        )
    return f"{head}replace `{one_line(edit.old)}` with `{one_line(edit.new)}` at {_at(edit)}{tail}"


def cut_history(name: str | None) -> str:
    """IPD110's other choice: the write's dependency on `name`'s history (the tensor's, when the name is
    not known) cut on purpose."""
    whose, t, style = (f"`{name}`'s", name, "") if name else ("the tensor's", "t", "-style")
    return (
        f"if no gradient should flow back through {whose} history, cut it explicitly before the write "
        f"(`{t} = {t}.detach()`{style}, then write into it); for a deliberate straight-through estimator, "
        f"write `{t} = {t} + (new - {t}).detach()`{style}"
    )


def _assigned(code: str) -> str | None:
    """`h` of `h = h.mul(2)` (the first statement's plain target)."""
    try:
        node = parse(code.strip()).body[0]
    except (SyntaxError, IndexError):
        return None
    target = node.targets[0] if isinstance(node, ast.Assign) else None
    return target.id if isinstance(target, ast.Name) else None


def _method(code: str) -> str:
    """`mul` of `h = h.mul(2)`."""
    try:
        node = parse(code.strip()).body[0]
    except (SyntaxError, IndexError):
        return "op"
    value = getattr(node, "value", None)
    func = value.func if isinstance(value, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else "op"


def _copy_at_handout(fix: Fix, finding: Finding, root_label: str) -> str:
    edit = fix.edits[0]
    if finding.code == "IPD107":
        return f"take a real snapshot at {_at(edit)}: replace `{edit.old}` with `{edit.new}`"
    return (
        f"hand out a copy: replace `{edit.old}` with `{edit.new}` at {_at(edit)}: the array then owns its memory "
        "and the saved tensor keeps its values; to change the tensor itself, do it in PyTorch so autograd sees it"
    )


def _flag_at_constructor(fix: Fix, finding: Finding, root_label: str) -> str:
    if len(fix.edits) > 1:  # one edit per place the finding folds in: all of them
        where = " and ".join(f"{_at(e)}" + (f" (`{built}`)" if (built := _statement(e)) else "") for e in fix.edits)
        return (
            f"construct each of {_places(finding, root_label)} with inplace=False, at {where} (every place: one "
            "alone leaves the others overwriting), or set `.inplace = False` on each"
        )
    edit = fix.edits[0]
    ref = module_ref(finding.mutation, root_label) or "the module"
    built = _statement(edit)
    shown = f" (`{built}`)" if built else ""
    return f"construct `{ref}` with inplace=False at {_at(edit)}{shown}, or set `{ref}.inplace = False`"


def _places(finding: Finding, root_label: str) -> str:
    """The modules a finding folds in, as the report lists them (`D.net.2`, `D.net.5`)."""
    places = finding.places or tuple(filter(None, [module_ref(finding.mutation, root_label)]))
    return ", ".join(f"`{p}`" for p in places) or "the modules"


def _flag_manual(fix: Fix, finding: Finding, root_label: str) -> str:
    if len(finding.places) > 1:  # every place the finding folds in
        return f"set `.inplace = False` on each of {_places(finding, root_label)} (or construct them with inplace=False)"
    ref = module_ref(finding.mutation, root_label)
    return f"set `{ref}.inplace = False` (or construct it with inplace=False)" if ref else ""


def _flag_at_call(fix: Fix, finding: Finding, root_label: str) -> str:
    if len(fix.edits) > 1:  # one edit per call the finding folds in: all of them
        return f"pass inplace=False at {' and '.join(_at(e) for e in fix.edits)} (every call: one alone leaves the others)"
    edit = fix.edits[0]
    line = _line(edit, edit.start.line).rstrip("\r\n")
    if edit.start.line == edit.end.line and line[edit.start.column : edit.end.column] == edit.old:
        old = without_comment(line.strip())
        new = without_comment((line[: edit.start.column] + edit.new + line[edit.end.column :]).strip())
        return f"pass inplace=False: replace `{old}` with `{new}` at {_at(edit)}"
    return f"pass inplace=False at {_at(edit)}"


def moved_edits(edits: tuple[Edit, ...]) -> tuple[Edit, Edit] | None:
    """(delete, insert) when two edits move statements within one file (the same code deleted and
    inserted, in either order: a step moved after a backward, an update moved first); else None."""
    if len(edits) != 2 or edits[0].path != edits[1].path:
        return None
    delete, insert = sorted(edits, key=lambda e: not e.old)
    if insert.old or delete.new or not delete.old or one_line(delete.old) != one_line(insert.new):
        return None
    return delete, insert


def moved_lines(delete: Edit) -> tuple[int, int]:
    """The first and last line of code a move's deletion takes (it may start at a blank or comment line)."""
    last = delete.end.line - 1 if delete.end.column == 0 else delete.end.line
    return _code_line_number(delete), last


def _moved(fix: Fix) -> tuple[Edit, Edit] | None:
    """A step moved after a backward: its (delete, insert)."""
    return moved_edits(fix.edits) if fix.kind is FixKind.MOVE_STATEMENT else None


def _update(finding: Finding) -> str:
    m = finding.mutation
    if m.api and m.api.endswith(".step"):
        return f"`{m.api}` at {m.location}"
    place = finding.places[0] if finding.places else ""
    return f"the update of `{place}` at {m.location}" if place else f"the update at {m.location}"


def _backward(finding: Finding) -> str:
    """The later backward, as the move fix's insertion names it."""
    for other in finding.fixes:
        moved = _moved(other)
        if moved is not None:
            return f"the backward at {_at(moved[1])}"
    backward = getattr(finding.facts, "backward", None)
    if isinstance(backward, Site) and backward.file:
        return f"the backward at {backward.location}"
    return "the later backward"


def _move(fix: Fix, finding: Finding, root_label: str) -> str:
    moved = _moved(fix)
    if moved is None:
        return ""
    delete, insert = moved
    stepped = finding.mutation.api is not None and finding.mutation.api.endswith(".step")
    caution = (
        ": moved alone, that backward's gradient also accumulates into the stepped parameters' `.grad` and the "
        "step applies it (restrict it with `loss.backward(inputs=[...])`), and code between the two that reads "
        "the parameters reads them before the update"
        if stepped
        else ", if that backward is meant to use the old values (code between the two then reads the old values)"
    )
    return f"move `{one_line(delete.old)}` ({_at(delete)}) after the backward at {_at(insert)}{caution}"


def _update_first(fix: Fix, finding: Finding, root_label: str) -> str:
    moved = moved_edits(fix.edits)
    if moved is None:
        return ""
    delete, insert = moved
    first, last = moved_lines(delete)
    lines = f"{Frame(delete.path, first, '').location}-{last}" if last > first else _code_at(delete)
    before = _code_line(insert)
    cleared = (
        f"; the gradient it also leaves in the stepped parameters' `.grad` is cleared by `{before}`"
        if ".zero_grad(" in before else
        ": that backward's gradient also accumulates into the stepped parameters' `.grad` unless their update starts "
        "with `zero_grad`"
    )
    return (
        f"update in the other order, from the same forward: move {moved_code(delete.old)} ({lines}) "
        f"before `{before}` at {_code_at(insert)}, so {_backward(finding)} runs before {_update(finding)} changes "
        f"the parameters it saved{cleared}"
    )


def _code_line_number(edit: Edit) -> int:
    """The first line from the edit's start that holds code (a moved block starts with its comments)."""
    if edit.old:
        lines = edit.old.splitlines()
        return edit.start.line + next((i for i, text in enumerate(lines) if without_comment(text).strip()), 0)
    line = edit.start.line
    while not without_comment(_line(edit, line).strip()) and line < edit.start.line + 50:
        line += 1
    return line


def _code_at(edit: Edit) -> str:
    return Frame(edit.path, _code_line_number(edit), "").location


def _code_line(edit: Edit) -> str:
    return without_comment(_line(edit, _code_line_number(edit)).strip())


def _move_manual(fix: Fix, finding: Finding, root_label: str) -> str:
    return f"move {_update(finding)} after {_backward(finding)}, if that backward is meant to use the old values"


def _recompute(fix: Fix, finding: Finding, root_label: str) -> str:
    return (
        f"run the forward that {_backward(finding)} uses again after {_update(finding)}, so its graph holds the "
        "updated parameters (pytorch/examples' DCGAN calls the discriminator again for the generator's loss)"
    )


def _detach_carried(fix: Fix, finding: Finding, root_label: str) -> str:
    return (
        f"detach the tensor the loop carries from one iteration to the next (a recurrent state, a running total "
        f"kept as a tensor) after {_update(finding)} (`h = h.detach()`): {_backward(finding)} runs again in a later "
        "iteration and reaches the graph an earlier iteration built; moving the step cannot help"
    )


_EDITED = {
    FixKind.CLONE_BEFORE_WRITE: _clone,
    FixKind.COMPUTE_THEN_WRITE: _compute_then_write,
    FixKind.OUT_OF_PLACE: _replace,
    FixKind.REBIND: _replace,
    FixKind.FLAG_OFF_AT_CONSTRUCTOR: _flag_at_constructor,
    FixKind.FLAG_OFF_AT_CALL: _flag_at_call,
    FixKind.MOVE_STATEMENT: _move,
    FixKind.UPDATE_FIRST: _update_first,
    FixKind.COPY_AT_HANDOUT: _copy_at_handout,
}
_MANUAL = {
    FixKind.FLAG_OFF_AT_CONSTRUCTOR: _flag_manual,
    FixKind.MOVE_STATEMENT: _move_manual,
    FixKind.RECOMPUTE: _recompute,
    FixKind.DETACH_CARRIED: _detach_carried,
}


# What an unproven fix changes besides what it is for, said where `fix` reports it written (never
# written in silence): a move changes which gradients an update applies; a copy of the caller's data
# changes what the caller reads.
_MOVED = {
    FixKind.MOVE_STATEMENT: "; moved after that backward, the update also applies the gradient that backward "
                            "accumulates into the parameters it updates, where it reaches them (another loss's gradient)",
    FixKind.UPDATE_FIRST: "; moved first, where that backward reaches the other update's parameters its gradient "
                          "stays in their `.grad` unless a `zero_grad` clears it before their step (they then also "
                          "train on that loss)",
}
_PURPOSE = {
    "IPD106": "; that difference is the fix's purpose: the model no longer writes into its caller's tensor, so what "
              "the caller reads afterwards changes (check that it is what the program means)",
}


def unproven_caveat(fix: Fix, code: str) -> str:
    """What an unproven `fix` of a finding of rule `code` changes besides its purpose ("" when nothing to say)."""
    return _MOVED.get(fix.kind, "") + _PURPOSE.get(code, "")


def is_offered(fix: Fix) -> bool:
    """Whether a fix may be applied without asking (SARIF's `fixes[]`, GitHub's one click): proven only."""
    return fix.applicability is Applicability.PROVEN and bool(fix.edits)
