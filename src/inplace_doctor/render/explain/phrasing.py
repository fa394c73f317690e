"""The sentence helpers of render/explain/: how a tensor, a write and its fix read.

The fixes quote the user's own line (read through `linecache`, with the standard library's `ast`
and regular expressions over that line, never over a text of ours).
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
from dataclasses import replace

from ...rules.phrasing import qualified as qualified  # how rules name places too; here for the explainers
from ...rules.phrasing import where as where
from ...rules.source import grad_off_copy, names_a_module, passed_argument, read, statement_at, tensor_method_exists
from ...findings import FixKind
from ...sites import Site, module_ref


def short_op(op: str) -> str:
    """`aten.relu_` -> `relu_`, `c10d.broadcast_` stays qualified."""
    return op.removeprefix("aten.")



def tensor_desc(shape: tuple[int, ...], dtype: str) -> str:
    return f"a [{', '.join(map(str, shape))}] {dtype} tensor"



_AUGMENTED = re.compile(r"^(?P<lhs>[\w.\[\]:, ]+?)\s*(?P<op>\+|-|\*|/|//|@|%|\*\*|&|\||\^)=\s*(?P<rhs>.+)$")
_INPLACE_CALL = re.compile(r"\.(?P<name>[a-z][a-z0-9_]*?)_\(")
_INPLACE_STATEMENT = re.compile(r"^(?P<target>[A-Za-z_][\w.]*?)\.(?P<name>[a-z][a-z0-9_]*?)_\(.*\)$")
_RECEIVER = re.compile(r"(?P<name>[A-Za-z_][\w.]*?)\.[a-z][a-z0-9_]*?_\(")
_WRITTEN_RECEIVER = re.compile(r"^(?P<base>[A-Za-z_]\w*)(?:\[[^=]*\]|\.detach\(\))*\.[a-z][a-z0-9_]*?_\(.*\)$")
_ASSIGNED = re.compile(r"^[A-Za-z_][\w.,\s]*=[^=]")


_INDEXED_TARGET = re.compile(r"^(?P<base>[A-Za-z_][\w.]*)\s*\[.*\]\s*(?:\*\*|//|[-+*/@%&|^])?=[^=]")


def without_comment(code: str) -> str:
    """`x[m] = 0  # pad` -> `x[m] = 0` (a `#` inside a string is kept)."""
    import io
    import tokenize

    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                return code[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return code


def step_fix(
    site: Site, backward: Site | None, owner: str | None, target: str | None = None, kinds: frozenset[FixKind] | None = None
) -> str:
    """An update of parameters or buffers (an optimizer step, a `no_grad` write to a weight) between a
    forward and the backward that needs that forward's values: keep the update, move it or the forward;
    `kinds`: the fixes the rule found (no move for a statement whose result the forward uses; only a
    detach when that backward is a later run of a line above the update)."""
    if site.api and site.api.endswith(".step"):
        step = f"`{site.api}` at {site.location}"
    else:
        step = f"the update of `{target}` at {site.location}" if target else f"the update at {site.location}"
    later = f"the backward at {backward.location}" if backward is not None and backward.file else "the later backward"
    if kinds is not None and FixKind.DETACH_CARRIED in kinds:
        return (
            f"{later} runs again in a later iteration and reaches the graph an earlier iteration built before "
            f"{step}, through a tensor the loop carries from one iteration to the next (a recurrent state, a "
            "running total kept as a tensor): detach that tensor after the step (`h = h.detach()`), so each "
            "backward stops at its own iteration's graph; moving the step cannot help"
        )
    kinds = frozenset({FixKind.RECOMPUTE, FixKind.MOVE_STATEMENT}) if kinds is None else kinds
    recompute = (
        f"run the forward that {later} uses again after {step}, so its graph holds the updated parameters "
        "(pytorch/examples' DCGAN calls the discriminator again for the generator's loss)"
    )
    if FixKind.MOVE_STATEMENT not in kinds:
        return recompute
    if not (site.api and site.api.endswith(".step")):
        return f"{recompute}; or move {step} after {later}, if that backward is meant to use the old values"
    whose = f"{owner}'s" if owner else "the stepped parameters'"
    return (
        f"{recompute}; or, to keep the old forward, move {step} after {later} and restrict that backward to "
        f"the parameters it should update (`loss.backward(inputs=[...])`): moved alone, that backward's "
        f"gradient also accumulates into {whose} `.grad` and the step applies it"
    )


_DATA_CALL = re.compile(r"^(?P<target>[A-Za-z_][\w.]*?)\.data\.(?P<name>[a-z][a-z0-9_]*?)_\((?P<args>.*)\)$")
_DATA_ASSIGN = re.compile(r"^(?P<target>[A-Za-z_][\w.]*?)\.data\s*=(?!=)\s*(?P<value>.+)$")


def silent_write_fix(site: Site) -> str:
    """A write through `.data` (or another alias without a version counter) to a tensor in the graph:
    the out-of-place op on the tensor itself keeps the new values and makes autograd see them."""
    code = without_comment(site.code or "")
    tail = (
        "autograd then differentiates through the change; if the new values must carry no gradient, compute "
        "them from a detached copy (`t.detach().clone()`) and use the copy instead"
    )
    call = _DATA_CALL.match(code)
    if call:
        target, name, args = call["target"], call["name"], call["args"]
        return f"replace `{code}` with `{target} = {target}.{name}({args})` at {site.location}: {tail}"
    assign = _DATA_ASSIGN.match(code)
    if assign:
        target, value = assign["target"], assign["value"].replace(f"{assign['target']}.data", assign["target"])
        return f"replace `{code}` with `{target} = {value}` at {site.location}: {tail}"
    return (
        f"make the write at {site.location} out of place on the tensor itself (`t = t.op(...)`, not through "
        f"`.data` or another alias), or move it after backward: {tail}"
    )


def fix_for_write(site: Site, root_label: str, saved: Site | None = None) -> str:
    """The exact change that makes this write out of place (or, for a caller's tensor, gives it a copy);
    `saved`: where the written tensor was saved, when that matters (the same statement)."""
    code = without_comment(site.code or "")
    ref = module_ref(site, root_label)
    if site.module_inplace and ref is not None:
        if site.origin is not None:
            built = without_comment(linecache.getline(site.origin.file, site.origin.line).strip())
            return (
                f"construct `{ref}` with inplace=False at {site.origin_location} (`{built}`), "
                f"or set `{ref}.inplace = False`"
            )
        return f"set `{ref}.inplace = False` (or construct it with inplace=False)"
    if site.api and site.api.endswith(".step"):
        return step_fix(site, None, None)
    argument = argument_fix(site, code)
    if argument:
        return argument
    grad_off = _copy_before_grad_off(site)
    if grad_off:
        return grad_off
    match = _AUGMENTED.match(code)
    if match and "[" not in match["lhs"]:  # `x[i] = x[i] + y` would still write into x: a copy below
        lhs, op, rhs = match["lhs"].strip(), match["op"], match["rhs"].strip()
        return f"replace `{code}` with `{augmented_out_of_place(lhs, op, rhs)}` at {site.location}"
    statement = _INPLACE_STATEMENT.match(code)
    if statement and not tensor_method_exists(statement["name"]):  # `s.copy_(v)`: no `copy`
        statement = None
    receiver = _WRITTEN_RECEIVER.match(code)
    if receiver and not statement and not names_a_module(site.file, receiver["base"]):
        base = receiver["base"]  # `s.copy_(v)` or `b[2].zero_()` alone: out of place would drop the write
        return f"write into a copy (`{base} = {base}.clone()` before `{code}`) at {site.location}"
    if statement:  # `x.relu_()` alone: its effect is the mutation, so the out-of-place form must rebind
        target, name = statement["target"], statement["name"]
        fixed = f"{target} = {code.replace(f'.{name}_(', f'.{name}(', 1)}"
        return f"use the out-of-place `{name}` and rebind the name: replace `{code}` with `{fixed}` at {site.location}"
    call = _INPLACE_CALL.search(code)
    if call and tensor_method_exists(call["name"]) and not _bare_call(code):  # a bare call's result is dropped
        name = call["name"]
        fixed = code.replace(f".{name}_(", f".{name}(", 1)
        receiver = _RECEIVER.search(code.split("=", 1)[-1] if "=" in code else code)
        keep = (
            f" (`{receiver['name']}` then keeps its old values: use the result where the changed values are meant)"
            if receiver and _ASSIGNED.match(code)
            else ""
        )
        return f"use the out-of-place `{name}`: replace `{code}` with `{fixed}` at {site.location}{keep}"
    if "inplace=True" in code:
        return f"pass inplace=False: replace `{code}` with `{code.replace('inplace=True', 'inplace=False')}` at {site.location}"
    if re.search(r"\]\s*(?:\*\*|//|[-+*/@%&|^])?=[^=]", code):
        target = _INDEXED_TARGET.match(code)
        name = target["base"] if target else "x"
        if saved is not None and (saved.file, saved.line) == (site.file, site.line):
            return (
                f"compute the value first, then write it into a copy (`{name} = {name}.clone()` between the two) "
                f"at {site.location}: the value is computed from the tensor `{code}` writes, so a copy made before "
                "the statement would be read and written alike and change nothing; or build the result out of place"
            )
        return (
            f"write into a copy (`{name} = {name}.clone()` before `{code}`) or build the result out of place "
            f"(torch.where) at {site.location}"
        )
    op = short_op(site.op)
    if op.endswith("_") and tensor_method_exists(op[:-1]):
        return f"use the out-of-place form of `{op}` (`{op[:-1]}`) at {site.location}, or modify a `.clone()`"
    return f"modify a `.clone()` of the tensor instead at {site.location}"


def _copy_before_grad_off(site: Site) -> str:
    """The fix for a write inside `with torch.no_grad():` (or `inference_mode()`): a result made out of
    place there carries no gradient, so the copy is made before the block; "" for a write outside one."""
    source = read(site.file)
    located = statement_at(source, site.line) if source is not None else None
    copy = grad_off_copy(source, located.node) if source is not None and located is not None else None
    if source is None or copy is None:
        return ""
    name, block = copy
    opening = source.line_text(block.lineno).strip()
    at = replace(site, line=block.lineno).location
    why = "made out of place inside that block, the result would carry no gradient"
    if name is None:
        return f"write into a `.clone()` made before `{opening}` at {at}: {why}"
    return f"write into a copy (`{name} = {name}.clone()` before `{opening}`) at {at}: {why}"


def _bare_call(code: str) -> bool:
    """Whether `code` is a call alone (`s.detach().mul_(2)`): its out-of-place form would drop the write."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call)


def augmented_out_of_place(lhs: str, op: str, rhs: str) -> str:
    """`x op= rhs` written out of place, `x = x op (rhs)`: Python evaluates the whole right-hand side
    first, so it is parenthesised unless it is one operand already (`x /= n + eps` is `x = x / (n +
    eps)`, not `x / n + eps`; `x += a + b` is `x + (a + b)`, which rounds as the original does)."""
    return f"{lhs} = {lhs} {op} {rhs if _one_operand(rhs) else f'({rhs})'}"


def _one_operand(code: str) -> bool:
    """Whether `code` is an expression no binary operator can split: a name, attribute, call,
    subscript, literal, or something already in brackets."""
    code = code.strip()
    try:
        node = ast.parse(code, mode="eval").body
    except SyntaxError:
        return False
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List)):
        return True
    return code.startswith("(") and _closing_bracket(code) == len(code) - 1


def inplace_statement(code: str) -> re.Match[str] | None:
    """`x.relu_()` or `self.h.clamp_(a, b)` as the whole statement (`target`, `name` groups): its
    effect is the mutation, so an out-of-place form must rebind the target."""
    return _INPLACE_STATEMENT.match(code)


def first_inplace_call(code: str) -> tuple[str, str] | None:
    """(the first in-place method call in `code`, whole; its receiver): `self.x.clamp_(-1, 1)` and
    `self.x` in `return f(self.x.clamp_(-1, 1))`."""
    start = _RECEIVER.search(code)
    if start is None:
        return None
    close = _closing_bracket(code[start.end() - 1 :])
    return (code[start.start() : start.end() + close], start["name"]) if close >= 0 else None


def _closing_bracket(code: str) -> int:
    """The index of the bracket closing the one `code` opens with (strings are not looked into)."""
    depth = 0
    for i, ch in enumerate(code):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            return i
    return -1


_WRITTEN_NAME = (
    re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*(?:\+|-|\*|/|//|@|%|\*\*|&|\||\^)=[^=]"),  # x += y
    re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*\[.*\]\s*(?:\*\*|//|[-+*/@%&|^])?=[^=]"),  # x[m] = v, x[m] += v
    re.compile(r"^(?P<name>[A-Za-z_]\w*)\.[a-z][a-z0-9_]*_\("),  # x.relu_()
)


def argument_fix(site: Site, code: str) -> str | None:
    """When the written tensor is an argument of a helper function (not a module's forward), its
    caller may rely on the change: the fix keeps the write and gives it a copy at the call."""
    if not site.stack or site.stack[-1].function in ("forward", "<module>"):
        return None
    name = next((m["name"] for p in _WRITTEN_NAME if (m := p.match(code))), None)
    inner = site.stack[-1]
    params = _parameters(inner.file, inner.function, inner.line)
    if name is None or params is None or name not in params:
        return None
    caller = site.stack[-2] if len(site.stack) > 1 else None
    head = (
        f"`{name}` is an argument of `{inner.function}` ({site.location}), so its caller may rely on this write: "
        "keep it, and give it a copy the saved graph does not hold"
    )
    if caller is None:
        return f"{head}: clone the argument where `{inner.function}` is called"
    call_line = without_comment(linecache.getline(caller.file, caller.line).strip())
    passed = _passed_argument(call_line, inner.function, params, name)
    where = caller.location
    if passed is not None and passed.isidentifier():
        return f"{head}: insert `{passed} = {passed}.clone()` before `{call_line}` at {where}"
    target = f"`{passed}`" if passed else f"the argument `{name}`"
    return f"{head}: clone {target} before the call `{call_line}` at {where}, and use the clone afterwards"


@functools.lru_cache(maxsize=256)
def _functions(path: str) -> tuple[tuple[str, int, int, tuple[str, ...]], ...]:
    """(name, first line, last line, parameter names) of every function defined in a file."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))
            out.append((node.name, node.lineno, node.end_lineno or node.lineno, names))
    return tuple(out)


def _parameters(path: str, function: str, line: int) -> tuple[str, ...] | None:
    inside = [(last - first, names) for name, first, last, names in _functions(path) if name == function and first <= line <= last]
    return min(inside)[1] if inside else None


def _passed_argument(call_line: str, function: str, params: tuple[str, ...], name: str) -> str | None:
    """The expression the caller passed for parameter `name` of `function` on `call_line`."""
    try:
        tree = ast.parse(call_line.strip())
    except SyntaxError:
        return None
    arg = passed_argument(tree, function, params, name)
    return ast.unparse(arg) if arg is not None else None
