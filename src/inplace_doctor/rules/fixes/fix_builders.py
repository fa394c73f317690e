"""Fix builders: each fix a rule decides on, as `Edit`s built from the source at the finding's sites.

A builder reads the statement at a site with `ast` (`rules/fixes/source.py`) and
returns `Fix` records; every edit's `path` is a site's file, never text taken
from a sentence. A fix with edits is `unsafe` until `inplace-doctor fix` has
checked it on the user's program (only that proof makes it `proven`); a fix no
edit can express (the statement is not one of the forms below, or the flag is
not a literal) is `manual`, with no edits. The English for each fix is made in
`render/` from these records.

The forms: `h[i] = v` (a copy before the write, or, when the saving op is in
that statement itself, the value computed first and written into a copy);
`x op= y` (out of place, rebound); `x.relu_()` alone (rebound, when tensors have `relu`; `s.copy_(v)`,
`b[2].zero_()`, `s.detach().mul_(2)` alone: a copy before the write); a write inside `with torch.no_grad():`
(a copy before the block: made out of place inside it, the result would carry no gradient); `F.relu_(h)` alone
(`h = F.relu(h)`: the twin the imported module has, none for `init.zeros_`); `y = x.add_(1)`
(the out-of-place method; none where Tensor has none: `h.zero_()`, `h.copy_(v)`); `inplace=True` at the constructor (in a call over several lines too,
or `nn.ReLU(True)`: by position, where torch.nn's signature puts it) or at a call;
`t.data.op_()` and `t.data = v` (on the tensor itself); a helper writing into
its argument (a copy at the call); memory handed out (copied where it is
handed out). An update of parameters is `rules/fixes/fix_moves.py`'s.
"""

from __future__ import annotations

import ast

from ...findings import Applicability, Edit, Fix, FixKind
from ...sites import Site, WriteForm
from .fix_flags import flag_at_constructor
from .fix_moves import step_fixes
from .source import (
    Located,
    Source,
    function_at,
    grad_off_copy,
    indexed_base,
    out_of_place_function,
    passed_argument,
    read,
    statement_at,
    tensor_method_exists,
    written_name,
    written_receiver,
    written_statement,
)

_OPS: dict[type[ast.operator], str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.MatMult: "@",
    ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<",
    ast.RShift: ">>",
}
_ONE_OPERAND = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple)


def made(kind: FixKind, *edits: Edit | None) -> Fix:
    """A fix of `kind`: unsafe with its edits when all could be built, else manual without them."""
    if edits and all(e is not None for e in edits):
        return Fix(kind, tuple(e for e in edits if e is not None), Applicability.UNSAFE)
    return Fix(kind)


def write_fixes(site: Site, saved: Site | None = None) -> tuple[Fix, ...]:
    """The fix for an in-place write at `site` (`saved`: where the tensor it wrote was saved, if any)."""
    if site.module_inplace and site.module is not None:
        return (flag_at_constructor(site.origin, site.module_type),)
    if site.api and site.api.endswith(".step"):
        return step_fixes(site, None)
    source = read(site.file)
    augmented = site.form is WriteForm.AUGMENTED
    located = written_statement(source, site.line, site.op, augmented) if source is not None else None
    if source is None or located is None:
        return ()
    argument = argument_fix(site, source, located)
    if argument is not None:
        return (argument,)
    stmt = located.node
    copy = grad_off_copy(source, stmt)
    if copy is not None:  # out of place inside `no_grad` would carry no gradient: a copy before the block
        name, block = copy
        edit = source.insert_before(block, f"{name} = {name}.clone()") if name else None
        return (made(FixKind.CLONE_BEFORE_WRITE, edit) if edit else Fix(FixKind.CLONE_BEFORE_WRITE),)
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, (ast.Name, ast.Attribute)):
        return (made(FixKind.OUT_OF_PLACE, source.replace(stmt, out_of_place(source, stmt))),)
    rebuilt = rebound(source, stmt) or _rebound_function(source, stmt)
    if rebuilt is not None:
        return (made(FixKind.REBIND, source.replace(stmt, rebuilt)),)
    result_used = _out_of_place_call(source, stmt)
    if result_used is not None:
        return (result_used,)
    flag = _inplace_keyword(source, stmt)
    if flag is not None:
        return (made(FixKind.FLAG_OFF_AT_CALL, flag),)
    written, receiver = indexed_base(stmt), written_receiver(stmt)
    name = written or (receiver if receiver not in _imported(source) else None)  # `init.zeros_(w)`: no name
    if name is None:
        return ()
    if saved is not None and saved.file == site.file and _spans(stmt, saved.line):  # read and written alike
        return (compute_then_write(source, located, name) if written else Fix(FixKind.COMPUTE_THEN_WRITE),)
    return (made(FixKind.CLONE_BEFORE_WRITE, source.insert_before(stmt, f"{name} = {name}.clone()")),)


def _out_of_place_call(source: Source, stmt: ast.stmt) -> Fix | None:
    """Where the statement uses an in-place call's result, the out-of-place call: `y = x.add_(1)` the
    method (x then keeps its values), `y = F.relu_(x)` the module's twin. None for no such call."""
    call = _inplace_method_call(stmt)
    twin = out_of_place_function(source, call) if call is not None and _on_a_module(source, call) else None
    if call is not None and (isinstance(stmt, ast.Expr) or (_on_a_module(source, call) and twin is None)):
        call = None  # its result unused: out of place would drop the write; `init.zeros_(w)` has no twin
    func = call.func if call is not None else None
    if isinstance(func, ast.Attribute) and not twin and not tensor_method_exists(func.attr[:-1]):
        call = None  # `y = s.copy_(v)`: tensors have no `copy`
    if call is None:
        return None
    func = call.func
    assert isinstance(func, ast.Attribute)
    new = f"{twin}{_arguments(source, call, func)}" if twin else _renamed_call(source, call, func.attr[:-1])
    return made(FixKind.OUT_OF_PLACE, source.replace(call, new))


def out_of_place(source: Source, stmt: ast.AugAssign) -> str:
    """`x op= rhs` as `x = x op (rhs)`: Python evaluates the whole right-hand side first, so it is
    bracketed unless it is one operand (`x /= n + eps` is `x = x / (n + eps)`)."""
    lhs, rhs = source.segment(stmt.target), source.segment(stmt.value)
    if not isinstance(stmt.value, _ONE_OPERAND) and not _bracketed(rhs):
        rhs = f"({rhs})"
    return f"{lhs} = {lhs} {_OPS[type(stmt.op)]} {rhs}"


def _bracketed(code: str) -> bool:
    if not code.startswith("("):
        return False
    depth = 0
    for i, ch in enumerate(code):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            return i == len(code) - 1
    return False


def rebound(source: Source, stmt: ast.stmt) -> str | None:
    """`x.relu_()` or `self.h.clamp_(a, b)` as the whole statement, rebound out of place; also
    `t.data.mul_(2)`, rebound on `t` itself."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    func = call.func
    if not (isinstance(func, ast.Attribute) and _is_inplace_name(func.attr) and _is_reference(func.value)):
        return None
    if _on_a_module(source, call):
        return None  # `torch.nn.init.zeros_(w)`, `F.relu_(h)`: a function, not a method of the tensor
    if not tensor_method_exists(func.attr[:-1]):
        return None  # `s.copy_(v)`, `h.zero_()`: no out-of-place method; a copy before the write instead
    receiver = func.value
    if isinstance(receiver, ast.Attribute) and receiver.attr == "data" and _is_reference(receiver.value):
        receiver = receiver.value
    target = source.segment(receiver)
    return f"{target} = {target}.{func.attr[:-1]}{_arguments(source, call, func)}"


def _rebound_function(source: Source, stmt: ast.stmt) -> str | None:
    """`F.relu_(h)` or `torch.clamp_(self.h, 0, 1)` as the whole statement: the module's out-of-place
    twin, its result bound to the written argument (`h = F.relu(h)`)."""
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    if call is None or not call.args or not _is_reference(call.args[0]) or not _on_a_module(source, call):
        return None
    twin = out_of_place_function(source, call)
    func = call.func
    if twin is None or not isinstance(func, ast.Attribute):
        return None
    return f"{source.segment(call.args[0])} = {twin}{_arguments(source, call, func)}"


def _arguments(source: Source, call: ast.Call, func: ast.Attribute) -> str:
    """The text of the call after its function: `(a, b)`."""
    text = source.segment(call)
    head = source.segment(func)
    return text[len(head):] if text.startswith(head) else text[text.index("(") :]


def _renamed_call(source: Source, call: ast.Call, name: str) -> str:
    func = call.func
    assert isinstance(func, ast.Attribute)
    return f"{source.segment(func.value)}.{name}{_arguments(source, call, func)}"


def _on_a_module(source: Source, call: ast.Call) -> bool:
    """Whether the call's receiver is an imported module (`torch.relu_`, `init.zeros_`), not a tensor."""
    node = call.func.value if isinstance(call.func, ast.Attribute) else call.func
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in _imported(source)


def _is_inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name[:-1].isidentifier()


def _is_reference(node: ast.expr) -> bool:
    """A name or a chain of attributes (`h`, `self.h`): something an assignment can rebind."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _inplace_method_call(stmt: ast.stmt) -> ast.Call | None:
    """The one in-place method call (`x.add_(1)`) in an assignment's value."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)) or stmt.value is None:
        return None
    calls = [
        n for n in ast.walk(stmt.value)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _is_inplace_name(n.func.attr)
    ]
    return calls[0] if len(calls) == 1 else None


def _inplace_keyword(source: Source, stmt: ast.stmt) -> Edit | None:
    """`inplace=True` -> `inplace=False` in the one call of `stmt` passing it."""
    keywords = [
        kw for n in ast.walk(stmt) if isinstance(n, ast.Call) for kw in n.keywords
        if kw.arg == "inplace" and isinstance(kw.value, ast.Constant) and kw.value.value is True
    ]
    return source.replace(keywords[0].value, "False") if len(keywords) == 1 else None


def _spans(stmt: ast.stmt, line: int | None) -> bool:
    return line is not None and stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)


def compute_then_write(source: Source, located: Located, name: str) -> Fix:
    """The saving op is in the writing statement (`buf[4] = torch.mul(buf[2], buf[3])`): a copy made
    before it would be both read and written, so compute the value from the original first, then
    write it into a copy."""
    stmt = located.node
    indent = source.indent_of(stmt)
    value = getattr(stmt, "value", None)
    if indent is None or not isinstance(value, ast.expr):
        return Fix(FixKind.COMPUTE_THEN_WRITE)
    fresh = _fresh_name(source, "value")
    if isinstance(stmt, ast.Assign):
        target, op = stmt.targets[0], "="
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        target, op = stmt.target, (f"{_OPS[type(stmt.op)]}=" if isinstance(stmt, ast.AugAssign) else "=")
    else:
        return Fix(FixKind.COMPUTE_THEN_WRITE)
    lines = (
        f"{fresh} = {source.segment(value)}",
        f"{name} = {name}.clone()",
        f"{source.segment(target)} {op} {fresh}",
    )
    return made(FixKind.COMPUTE_THEN_WRITE, source.replace(stmt, f"\n{indent}".join(lines)))


def _fresh_name(source: Source, base: str) -> str:
    taken = source.names()
    return next(n for n in (base, *(f"{base}_{i}" for i in range(1, 1000))) if n not in taken)


def argument_fix(site: Site, source: Source, located: Located) -> Fix | None:
    """The written tensor is an argument of a helper function (not a module's forward): its caller
    may rely on the change, so the write stays and the caller passes a copy."""
    if len(site.stack) < 2 or site.stack[-1].function in ("forward", "<module>"):
        return None
    written = written_name(located.node)
    function = function_at(source, located.node.lineno)
    if written is None or function is None or function.name != site.stack[-1].function:
        return None
    a = function.args
    params = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if written not in params:
        return None
    caller = site.stack[-2]
    caller_source = read(caller.file)
    call_site = statement_at(caller_source, caller.line) if caller_source is not None else None
    if caller_source is None or call_site is None:
        return Fix(FixKind.CLONE_BEFORE_WRITE)
    passed = _passed(call_site.node, function.name, params, written)
    if passed is None:
        return Fix(FixKind.CLONE_BEFORE_WRITE)
    return made(FixKind.CLONE_BEFORE_WRITE, caller_source.insert_before(call_site.node, f"{passed} = {passed}.clone()"))


def _passed(stmt: ast.stmt, function: str, params: list[str], name: str) -> str | None:
    """The plain name the caller passed for parameter `name` of `function` (None for an expression)."""
    arg = passed_argument(stmt, function, params, name)
    return arg.id if isinstance(arg, ast.Name) else None


def silent_write_fixes(site: Site) -> tuple[Fix, ...]:
    """A write through `.data`: the out-of-place op on the tensor itself (`t.data.mul_(2)` ->
    `t = t.mul(2)`, `t.data = v` -> `t = v`), so autograd sees the change."""
    source = read(site.file)
    located = statement_at(source, site.line) if source is not None else None
    if source is None or located is None:
        return ()
    stmt = located.node
    rebuilt = rebound(source, stmt)
    if rebuilt is not None:
        return (made(FixKind.REBIND, source.replace(stmt, rebuilt)),)
    if (
        isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
        and stmt.targets[0].attr == "data" and _is_reference(stmt.targets[0].value)
    ):
        target = source.segment(stmt.targets[0].value)
        value = source.segment(stmt.value).replace(f"{target}.data", target)
        return (made(FixKind.OUT_OF_PLACE, source.replace(stmt, f"{target} = {value}")),)
    return ()


def copy_at_handout(site: Site | None, method: str) -> tuple[Fix, ...]:
    """Memory handed out where it should have been copied: `t.numpy()` -> `t.numpy().copy()` (also
    `__dlpack__()`), `m.state_dict()` -> a snapshot of it (`copy.deepcopy(...)` where the file imports
    `copy`, else a dict of detached clones)."""
    source = read(site.file) if site is not None else None
    located = statement_at(source, site.line) if source is not None and site is not None else None
    if source is None or located is None:
        return ()
    calls = [
        n for n in ast.walk(located.node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method and not n.args
    ]
    if len(calls) != 1:
        return (Fix(FixKind.COPY_AT_HANDOUT),)
    call, text = calls[0], source.segment(calls[0])
    if method != "state_dict":
        return (made(FixKind.COPY_AT_HANDOUT, source.replace(call, f"{text}.copy()")),)
    if "copy" in _imported(source):
        return (made(FixKind.COPY_AT_HANDOUT, source.replace(call, f"copy.deepcopy({text})")),)
    k, v = _fresh_name(source, "k"), _fresh_name(source, "v")
    return (made(FixKind.COPY_AT_HANDOUT, source.replace(call, f"{{{k}: {v}.detach().clone() for {k}, {v} in {text}.items()}}")),)


def pointer_handout(site: Site | None) -> tuple[str | None, tuple[Fix, ...]]:
    """A raw pointer handed out (`t.data_ptr()`) on the line of the call it is passed to (a kernel's
    launch): (that call's name, the launch being the write; the fix that keeps the write's purpose:
    `t = t.clone()` before the line, so the kernel writes a copy the rest of the program reads, and
    the tensor autograd saved keeps its values). The fix is manual where the receiver is no plain name."""
    source = read(site.file) if site is not None else None
    located = statement_at(source, site.line) if source is not None and site is not None else None
    if source is None or located is None:
        return None, (Fix(FixKind.CLONE_BEFORE_WRITE),)
    handed = [
        n for n in ast.walk(located.node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "data_ptr" and not n.args
    ]
    if len(handed) != 1:
        return None, (Fix(FixKind.CLONE_BEFORE_WRITE),)
    pointer = handed[0]
    launches = [
        n for n in ast.walk(located.node)
        if isinstance(n, ast.Call) and any(a is pointer for a in [*n.args, *(k.value for k in n.keywords)])
    ]
    launch = source.segment(launches[0].func) if len(launches) == 1 else None
    receiver = pointer.func.value if isinstance(pointer.func, ast.Attribute) else None
    if not isinstance(receiver, ast.Name):
        return launch, (Fix(FixKind.CLONE_BEFORE_WRITE),)
    name = receiver.id
    return launch, (made(FixKind.CLONE_BEFORE_WRITE, source.insert_before(located.node, f"{name} = {name}.clone()")),)


def _imported(source: Source) -> set[str]:
    """Names the file's imports bind (`import copy`, `import torch.nn.functional as F`: `F`; `from
    torch.nn import init`: `init`)."""
    return {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(source.tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
    }
