"""Adversarial checks of the entry points that push IPD105/IPD106's mode only while needed (`inplace_entry.py`).

Each test runs a program with and without the tool (or under the fast and the deep tracer) and
compares what the program sees: its results, torch's functions, the mode stack, the findings.
"""

from __future__ import annotations

import copy
import functools
import inspect
import pickle
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import line_of
from torch import nn
from torch.overrides import TorchFunctionMode

import inplace_doctor as ipd

_FLAGGED = ("relu", "dropout", "hardtanh", "elu", "leaky_relu", "threshold", "silu")
_captured_relu = F.relu  # bound at import, before any session


def _stack() -> list[object]:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def _torchs_state() -> tuple[object, ...]:
    """What the entry points patch: the functions' code, the module's names, Tensor's own methods."""
    return (
        tuple(getattr(F, name).__code__ for name in _FLAGGED),
        "_inplace_doctor_entry" in vars(F),
        tuple(vars(torch.Tensor).get(name) for name in ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ior__")),
    )


_PLAIN = _torchs_state()


def _codes(session: Any) -> list[str]:
    return sorted(f.code for f in session.findings)


def _both(program: Callable[[], Any]) -> tuple[list[str], list[str]]:
    """The findings of `program` under the fast and under the deep tracer; nothing left behind after either."""
    found = []
    for deep in (False, True):
        with ipd.watch(deep=deep) as session:
            program()
        assert _stack() == [] and _torchs_state() == _PLAIN
        found.append(_codes(session))
    return found[0], found[1]


def _read_after_relu() -> None:
    h = torch.randn(4) * 2
    out = F.relu(h, inplace=True)
    torch.cat([h, out])  # reads what relu overwrote: IPD105


class _Bad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        F.relu(h, inplace=True)
        h += torch.ones(3)  # wrong shape: raises inside the module
        return h


def test_errors_raised_inside_inplace_calls_leave_the_stack_and_code_as_found_and_later_reads_reported() -> None:
    """An exception inside an in-place call (in or outside a module) pops nothing of the program's and unpatches nothing early."""

    def program() -> None:
        for bad in (
            lambda: F.relu(torch.tensor([True, False]), inplace=True),
            lambda: F.hardtanh(torch.randn(3), 1.0, -1.0, inplace=True),
            lambda: F.threshold(torch.randn(3), 0.0, torch.ones(2), inplace=True),
            lambda: _Bad()(torch.randn(4)),
        ):
            with pytest.raises((RuntimeError, ValueError, TypeError, NotImplementedError)):
                bad()
        assert [m for m in _stack() if not type(m).__module__.startswith("inplace_doctor")] == []
        _read_after_relu()

    fast, deep = _both(program)
    assert fast == deep and fast.count("IPD105") == 2  # `_Bad`'s read of `h`, and the later one


class _Counting(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("deep", [False, True])
def test_a_program_mode_entered_inside_and_exited_after_the_watch_sees_what_it_sees_without_the_tool(deep: bool) -> None:
    """The program's own mode, left open across the watch's exit, is the one its exit takes off."""
    seen = []
    for watched in (False, True):
        torch.manual_seed(0)
        mode = _Counting()
        watch = ipd.watch(deep=deep)
        if watched:
            watch.__enter__()
        h = torch.randn(4) * 2
        mode.__enter__()
        out = F.relu(h, inplace=True)
        torch.cat([h, out])
        if watched:
            watch.__exit__(None, None, None)
        mode.__exit__(None, None, None)
        assert _stack() == [] and _torchs_state() == _PLAIN
        seen.append(mode.calls)
    assert seen[0] == seen[1] == ["relu", "cat"]


class _ReluInside(TorchFunctionMode):
    """A program's mode whose handler itself makes an in-place functional call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.sin:
            return F.relu(args[0].clone(), inplace=True)
        return func(*args, **(kwargs or {}))


def test_a_program_mode_that_calls_inplace_functionals_computes_and_reports_as_under_deep() -> None:
    """An in-place call inside the program's own mode's handler: same values, same findings as deep."""
    values = []

    def program() -> None:
        torch.manual_seed(0)
        with _ReluInside():
            h = torch.randn(4) * 2
            y = torch.sin(h)
            out = F.relu(h, inplace=True)
            values.append(torch.cat([h, out, y]))

    program()
    fast, deep = _both(program)
    assert fast == deep == ["IPD105"]
    assert torch.equal(values[0], values[1]) and torch.equal(values[0], values[2])


class _Lazy(nn.Module):
    def forward(self, x: torch.Tensor) -> Iterator[torch.Tensor]:
        def steps() -> Iterator[torch.Tensor]:
            h = x * 2
            out = F.relu(h, inplace=True)
            yield out
            yield torch.cat([h, out])

        return steps()


@pytest.mark.parametrize("deep", [False, True])
def test_a_generator_suspended_inside_the_watch_and_resumed_after_computes_as_without_it(deep: bool) -> None:
    """A forward's generator resumed after the watch exits runs on torch's own code with no mode of the tool."""
    x = torch.randn(4)
    plain = list(_Lazy()(x))
    with ipd.watch(deep=deep):
        steps = _Lazy()(x)
        first = next(steps)
    assert _stack() == [] and _torchs_state() == _PLAIN
    second = next(steps)
    assert _stack() == []
    assert torch.equal(first, plain[0]) and torch.equal(second, plain[1])


def test_torchs_flagged_functions_keep_signature_pickle_copy_and_wraps_during_and_after() -> None:
    """`inspect.signature`, `functools.wraps`, `pickle`, `copy` of the swapped functions answer as torch's."""
    functions = [F.relu, F.dropout, F.hardtanh]
    signatures = [inspect.signature(f) for f in functions]
    for watched in (True, False):
        with ipd.watch() if watched else _nothing():
            for f, signature in zip(functions, signatures):
                assert inspect.signature(f) == signature
                assert pickle.loads(pickle.dumps(f)) is f and copy.deepcopy(f) is f and copy.copy(f) is f
                wrapper = functools.wraps(f)(functools.partial(_call, f))
                assert inspect.signature(wrapper) == signature and wrapper.__wrapped__ is f
    assert _torchs_state() == _PLAIN


def _call(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return f(*args, **kwargs)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_tensors_augmented_methods_pickle_by_reference_during_the_watch() -> None:
    """`pickle.dumps(torch.Tensor.__iadd__)` works during a watch as it does without one."""
    names = ["__iadd__", "__imul__", "__itruediv__", "__ior__"]
    plain = [pickle.loads(pickle.dumps(getattr(torch.Tensor, n))) is getattr(torch.Tensor, n) for n in names]
    with ipd.watch():
        during = [pickle.loads(pickle.dumps(getattr(torch.Tensor, n))) is getattr(torch.Tensor, n) for n in names]
        x = torch.ones(2)
        x += 1
    assert plain == during == [True] * 4 and torch.equal(x, torch.full((2,), 2.0))


def test_an_inplace_call_through_a_reference_taken_before_the_watch_is_reported_as_under_deep() -> None:
    """`relu = F.relu` bound before the watch reaches the entry code: the same IPD105 as deep."""

    def program() -> None:
        h = torch.randn(4) * 2
        out = _captured_relu(h, inplace=True)
        torch.cat([h, out])
        h2 = torch.randn(4) * 2
        out2 = F.dropout(h2, 0.5, True, True)  # the flag positional
        torch.cat([h2, out2])

    fast, deep = _both(program)
    assert fast == deep == ["IPD105", "IPD105"]


def _step(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    return F.relu(y, inplace=True) + F.hardtanh(y, -1.0, 1.0, False)


def test_scripted_and_compiled_functions_with_inplace_calls_compute_as_without_the_watch() -> None:
    """`torch.jit.script` and `torch.compile(backend="eager")` of an `inplace=True` call, made under the watch."""
    x = torch.randn(8)
    expected = _step(x)
    with ipd.watch():
        scripted = torch.jit.script(_step)
        compiled = torch.compile(_step, backend="eager")
        assert torch.equal(scripted(x), expected) and torch.equal(compiled(x), expected)
    assert torch.equal(scripted(x), expected) and torch.equal(compiled(x), expected)
    assert _torchs_state() == _PLAIN


class _OwnIadd(torch.Tensor):
    def __iadd__(self, other: Any) -> Any:
        self.tag = "own"
        return super().__iadd__(other)


class _Functioned(torch.Tensor):
    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def _augmented_program() -> list[object]:
    torch.manual_seed(0)
    seen: list[object] = []
    a = torch.randn(4).as_subclass(_OwnIadd)
    kept = a
    a += 1
    seen += [a is kept, type(a), getattr(a, "tag", None), a.as_subclass(torch.Tensor).clone()]
    b = torch.randn(4).as_subclass(_Functioned)
    kept_b = b
    _Functioned.calls.clear()
    b += 1
    seen += [b is kept_b, type(b), list(_Functioned.calls), b.as_subclass(torch.Tensor).clone()]
    layer = nn.Linear(3, 3)
    p = layer.weight
    with torch.no_grad():
        p += 1
    seen += [p is layer.weight, type(p), p.requires_grad, layer.weight.detach().clone()]
    i = 3
    i += 2
    n = np.ones(3)
    kept_n = n
    n += 1
    items = [1]
    items += [2]
    t = torch.ones(3)
    t += np.ones(3)
    q = torch.arange(6)
    q //= 2
    q <<= 1
    q |= 1
    q ^= 3
    q %= 5
    r = torch.ones(2, 2)
    r @= torch.eye(2)
    r **= 2
    r /= 3
    r -= 1
    seen += [i, n is kept_n, n.tolist(), items, t, q, r]
    return seen


def _same(a: list[object], b: list[object]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b)
    )


def test_augmented_assignments_on_subclasses_parameters_and_non_tensors_compute_as_without_the_tool() -> None:
    """`+=` and kin on a subclass with its own `__iadd__`, a `__torch_function__` subclass, a Parameter under
    no_grad, ints, lists and numpy arrays: same objects and values, same findings as deep."""
    plain = _augmented_program()
    for deep in (False, True):
        with ipd.watch(deep=deep) as session:
            watched = _augmented_program()
        assert _same(plain, watched) and session.findings == []
    assert _torchs_state() == _PLAIN and _stack() == []


def test_another_threads_inplace_calls_are_untouched_and_unrecorded() -> None:
    """A thread with no watch of its own gets torch's results (the very object) and no mode, while the main thread is watched."""
    stop, started = threading.Event(), threading.Event()
    seen: dict[str, object] = {"same object": True, "modes": 0, "calls": 0}

    def worker() -> None:
        while not stop.is_set() or not seen["calls"]:
            h = torch.randn(4) * 2
            out = F.relu(h, inplace=True)
            seen["same object"] = seen["same object"] and out is h
            seen["modes"] = max(int(seen["modes"]), torch._C._len_torch_function_stack())  # type: ignore[call-overload]
            torch.cat([h, out])
            seen["calls"] = int(seen["calls"]) + 1  # type: ignore[call-overload]
            started.set()

    thread = threading.Thread(target=worker)
    with ipd.watch() as session:
        thread.start()
        assert started.wait(30)
        _read_after_relu()
        stop.set()
        thread.join(30)
    assert seen["same object"] is True and seen["modes"] == 0 and _codes(session) == ["IPD105"]


def test_a_call_of_another_thread_that_began_as_the_last_watch_left_runs_torchs_code() -> None:
    """A thread preempted on entering swapped `F.relu` as the last watch exits gets torch's result, not a NameError."""
    at_entry, exited = threading.Event(), threading.Event()
    result: list[object] = []

    def stop_at_the_entry(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and "_inplace_doctor_entry" in frame.f_code.co_names:
            at_entry.set()
            exited.wait(30)  # the watch exits here: torch's code back, the entry's name gone

    def worker() -> None:
        sys.settrace(stop_at_the_entry)
        try:
            result.append(F.relu(torch.tensor([-1.0, 2.0])))
        except Exception as exc:  # noqa: BLE001 (the assertion names it)
            result.append(exc)
        finally:
            sys.settrace(None)

    watch = ipd.watch()
    watch.__enter__()
    thread = threading.Thread(target=worker)
    try:
        thread.start()
        assert at_entry.wait(30)
    finally:
        watch.__exit__(None, None, None)
        exited.set()
        thread.join(30)
    assert len(result) == 1 and isinstance(result[0], torch.Tensor), result
    assert torch.equal(result[0], torch.tensor([0.0, 2.0])) and _torchs_state() == _PLAIN


@pytest.mark.parametrize("outer_deep, inner_deep", [(False, True), (True, False), (False, False)])
def test_nested_watches_of_either_tracer_report_as_nested_deep_watches(outer_deep: bool, inner_deep: bool) -> None:
    """Inner fast in outer deep and the reverse: each session's findings are those of two deep sessions."""

    def program() -> None:
        _read_after_relu()
        x = torch.randn(4)
        kept = x
        x += 1
        torch.sin(kept)

    found = {}
    for outer, inner in ((outer_deep, inner_deep), (True, True)):
        with ipd.watch(deep=outer) as o:
            with ipd.watch(deep=inner) as i:
                program()
            program()
        found[(outer, inner)] = (_codes(o), _codes(i))
        assert _stack() == [] and _torchs_state() == _PLAIN
    assert found[(outer_deep, inner_deep)] == found[(True, True)]


def test_a_program_mode_entered_before_and_exited_inside_the_watch_is_gone_after_it() -> None:
    """Out of order the other way: the program's mode, exited inside the watch, is not on the stack after it."""
    mode = _Counting()
    mode.__enter__()
    try:
        with ipd.watch():
            h = torch.randn(4) * 2
            out = F.relu(h, inplace=True)  # pushes the tool's mode, above the program's
            mode.__exit__(None, None, None)
            torch.cat([h, out])
        assert _stack() == []
    finally:
        while _stack():
            torch._C._pop_torch_function_stack()


def test_a_program_mode_that_popped_the_tools_is_gone_after_the_watch_and_reads_are_still_seen() -> None:
    """After the program's exit popped the tool's mode, IPD105 still sees reads and the program's mode is off by the watch's end."""
    mode = _Counting()
    mode.__enter__()
    try:
        with ipd.watch() as session:
            h = torch.randn(4) * 2
            F.relu(h, inplace=True)  # pushes the tool's mode, above the program's
            mode.__exit__(None, None, None)  # torch pops the top: the tool's
            g = torch.randn(4) * 2
            out = F.relu(g, inplace=True)
            both = torch.cat([g, out])  # <reads the original>
        assert _stack() == [] and both.shape == (8,)
        seen = list(mode.calls)
        torch.ones(2).add(1)
        assert mode.calls == seen
        assert [(f.code, f.read.line) for f in session.findings] == [("IPD105", line_of(__file__, "# <reads the original>"))]
    finally:
        while _stack():
            torch._C._pop_torch_function_stack()


def _program_under_a_mode_entered_before(watched: bool) -> list[str]:
    mode = _Counting()
    with mode, ipd.watch() if watched else _nothing():
        h = torch.ones(4) * 2
        out = F.relu(h, inplace=True)
        torch.cat([h, out])
    return mode.calls


def test_a_program_mode_entered_before_the_watch_sees_only_the_programs_calls() -> None:
    """A mode the program entered before the watch sees the calls it sees without the tool, no more."""
    plain = _program_under_a_mode_entered_before(False)
    watched = _program_under_a_mode_entered_before(True)
    assert plain == ["ones", "mul", "relu", "cat"] and watched == plain


def test_jit_trace_of_an_inplace_module_under_the_watch_traces_the_programs_graph() -> None:
    """`torch.jit.trace` of a model with `nn.ReLU(inplace=True)` under the watch passes its check and records the same ops."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    x = torch.randn(3, 4)

    def ops(traced: Any) -> list[str]:
        return [node.kind() for node in traced.inlined_graph.nodes()]

    plain = torch.jit.trace(model, x)
    for deep in (False, True):
        with warnings.catch_warnings(record=True) as caught, ipd.watch(deep=deep):
            warnings.simplefilter("always")
            watched = torch.jit.trace(model, x)
        assert ops(watched) == ops(plain)
        # the tool's own reads of sizes are not traced values: no TracerWarning points at its files
        assert not [w for w in caught if "inplace_doctor" in w.filename], [str(w.message) for w in caught]


_WRAPPED_BEFORE_THE_FIRST_WATCH = """
import functools, torch, torch.nn.functional as F
import inplace_doctor as ipd
torch_relu, torch_hardtanh = F.relu, F.hardtanh
@functools.wraps(torch_relu)
def relu(*args, **kwargs):
    return torch_relu(*args, **kwargs)
F.relu = relu  # a program's patches, made before the process's first watch
F.hardtanh = lambda input, min_val=-1.0, max_val=1.0, inplace=False: torch_hardtanh(input, min_val, max_val, inplace)
found = {}
for deep in (False, True):
    for name in ("relu", "hardtanh"):
        with ipd.watch(deep=deep) as session:
            x = torch.tensor([-2.0, 0.5])
            assert torch.equal(getattr(F, name)(x), {"relu": torch_relu, "hardtanh": torch_hardtanh}[name](x))
            h = torch.randn(4) * 2
            out = getattr(F, name)(h, inplace=True)
            torch.cat([h, out])
        found[name, deep] = sorted(f.code for f in session.findings)
assert F.relu is relu and torch_relu.__code__.co_name == "relu"
print(found)
"""


@functools.cache
def _wrapped_before_the_first_watch() -> dict[tuple[str, bool], list[str]]:
    """The findings of the script above, run once in a fresh process (its first watch comes after the patches)."""
    import ast
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _WRAPPED_BEFORE_THE_FIRST_WATCH], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_programs_functools_wraps_wrapper_set_on_F_before_the_first_watch_keeps_working_and_is_seen_through() -> None:
    """A `functools.wraps` wrapper the program set on `F.relu` before the process's first watch: its calls work, its in-place call is reported as under deep."""
    found = _wrapped_before_the_first_watch()
    assert found["relu", False] == found["relu", True] == ["IPD105"]


@pytest.mark.xfail(strict=True, reason=(
    "torch's F.hardtanh is found only in torch.nn.functional's namespace, at the first session: replaced there "
    "by a plain wrapper (no __wrapped__) before it, its code is never swapped and its inplace=True calls push nothing"
))
def test_a_programs_plain_wrapper_set_on_F_before_the_first_watch_is_seen_through() -> None:
    """A wrapper without `__wrapped__` set on `F.hardtanh` before the first watch: its in-place call is reported as under deep."""
    found = _wrapped_before_the_first_watch()
    assert found["hardtanh", True] == ["IPD105"]
    assert found["hardtanh", False] == found["hardtanh", True]


def test_wrong_calls_of_the_swapped_functions_raise_torchs_errors() -> None:
    """A bad call of a swapped function raises the same error, with the same message, as without the watch."""
    calls = [
        lambda: F.relu(torch.ones(1), True, 3),
        lambda: F.relu(),
        lambda: F.relu(torch.ones(1), foo=1),
        lambda: F.dropout(torch.ones(1), p=2.0, inplace=True),
    ]

    def errors() -> list[tuple[str, str]]:
        seen = []
        for call in calls:
            with pytest.raises(Exception) as raised:  # noqa: PT011 (compared below)
                call()
            seen.append((type(raised.value).__name__, str(raised.value)))
        return seen

    plain = errors()
    with ipd.watch():
        watched = errors()
    assert watched == plain and plain[0] == ("TypeError", "relu() takes from 1 to 2 positional arguments but 3 were given")


def _augmented_method_calls() -> list[object]:
    seen: list[object] = []
    for name, args, kwargs in [
        ("__iadd__", (2,), {"alpha": 2}),
        ("__isub__", (2, 3), {}),
        ("__iadd__", (), {}),
        ("__ipow__", (), {"other": 2}),
        ("__imul__", (3,), {}),
    ]:
        x = torch.ones(2)
        try:
            out = getattr(x, name)(*args, **kwargs)
            seen.append(out.tolist() if isinstance(out, torch.Tensor) else out)
        except TypeError as exc:
            seen.append(str(exc))
    return seen


def test_tensors_augmented_methods_called_directly_take_what_torchs_take() -> None:
    """`x.__iadd__(y, alpha=2)`, `x.__isub__(y, 3)` and odd calls answer under the watch as torch's methods do."""
    plain = _augmented_method_calls()
    with ipd.watch():
        watched = _augmented_method_calls()
    assert watched == plain and plain[:2] == [[5.0, 5.0], [-5.0, -5.0]]


_counted: list[int] = []


def _programs_relu6(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:  # noqa: A002 (torch's name)
    """A program's code for `F.relu6` (it runs with `F`'s globals): clamps at 5."""
    return hardtanh(input, 0.0, 5.0, inplace)  # type: ignore[name-defined]  # noqa: F821 (`F`'s)


def test_the_programs_own_patches_made_before_or_during_the_watch_are_left_in_place() -> None:
    """A program's `Tensor.__iadd__` set before the watch and a `__code__` it swaps in during it are what stays after."""
    torch_iadd, torch_code = torch.Tensor.__iadd__, F.relu6.__code__
    _counted.clear()

    def iadd(self: torch.Tensor, other: Any) -> Any:
        _counted.append(1)
        return torch_iadd(self, other)

    torch.Tensor.__iadd__ = iadd  # type: ignore[method-assign,assignment]
    try:
        with ipd.watch():
            x = torch.ones(2)
            x += 1
            F.relu6.__code__ = _programs_relu6.__code__
        assert vars(torch.Tensor)["__iadd__"] is iadd and F.relu6.__code__ is _programs_relu6.__code__
        y = torch.ones(2)
        y += 1
        assert torch.equal(F.relu6(torch.full((2,), 9.0)), torch.full((2,), 5.0))
        assert _counted == [1, 1] and torch.equal(x, y)
    finally:
        del torch.Tensor.__iadd__
        F.relu6.__code__ = torch_code
    assert _torchs_state() == _PLAIN


@pytest.mark.parametrize("deep", [False, True])
def test_an_error_of_an_inplace_call_that_ends_the_watch_leaves_nothing_behind(deep: bool) -> None:
    """An in-place call's error raised out of the watch (and out of a program mode inside it) unwinds every mode and patch."""
    h = torch.randn(4) * 2
    with pytest.raises(RuntimeError, match="must match"), ipd.watch(deep=deep) as session:
        out = F.relu(h, inplace=True)  # the tool's mode pushed: `h` awaits its read
        with _Counting():
            torch.cat([h, out])
            h += torch.ones(3)
    assert _stack() == [] and _torchs_state() == _PLAIN
    assert _codes(session) == ["IPD105"]


def test_a_copy_of_the_entry_code_another_tool_swaps_in_during_the_watch_still_runs_torchs_code_after() -> None:
    """A code another tool swaps in over the entry (a copy, as line profilers make) is left there, and still computes."""
    torch_code = F.relu6.__code__
    x = torch.tensor([-1.0, 3.0, 9.0])
    try:
        with ipd.watch():
            copied = F.relu6.__code__.replace(co_name=F.relu6.__code__.co_name)
            assert copied is not torch_code and copied is not F.relu6.__code__
            F.relu6.__code__ = copied
        assert F.relu6.__code__ is copied  # another tool's, not taken away
        assert torch.equal(F.relu6(x), torch.tensor([0.0, 3.0, 6.0]))
        assert torch.equal(F.relu6(x.clone(), inplace=True), torch.tensor([0.0, 3.0, 6.0]))
    finally:
        F.relu6.__code__ = torch_code
