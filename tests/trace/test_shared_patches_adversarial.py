"""The shared patches against a program that patches too, threads, forks and the lingering kernels.

`trace/process/shared_patches.py` (`SharedPatch`, `SharedGroup`), its users `hand_outs.py` and
`inplace_entry.py`, and `kernel_registration.py`: the program computes what it computes without the
tool, torch's attributes are its own objects again after, and a patch the program made is its own.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import inplace_doctor as ipd
from inplace_doctor.trace.fast import hand_outs
from inplace_doctor.trace.fast.write_kernels import end_linger, registered
from inplace_doctor.trace.process import kernel_registration
from inplace_doctor.trace.process.shared_patches import SharedPatch

NAMES = ("numpy", "data_ptr", "__array__", "__dlpack__", "__iadd__", "detach")


def _torchs() -> dict[str, Any]:
    """What `torch.Tensor` itself holds for each patched name (None: only inherited)."""
    return {name: torch.Tensor.__dict__.get(name) for name in NAMES}


def _same(before: dict[str, Any]) -> list[str]:
    now = _torchs()
    return [name for name in NAMES if now[name] is not before[name]]


def _mine(self: Any, *args: Any, **kwargs: Any) -> str:
    return "mine"


@pytest.fixture
def tensor_methods() -> Any:
    """torch.Tensor's own methods, put back after the test whatever it left."""
    before = _torchs()
    yield before
    for name, value in before.items():
        if value is None:
            if name in torch.Tensor.__dict__:
                delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, value)


def test_a_patch_the_program_makes_inside_a_watch_is_kept(tensor_methods: dict[str, Any]) -> None:
    """A method the program replaces while a watch runs is the program's after the watch."""
    with ipd.watch():
        torch.Tensor.numpy = _mine  # type: ignore[method-assign]
        torch.Tensor.data_ptr = _mine  # type: ignore[method-assign]
    assert torch.Tensor.__dict__["numpy"] is _mine and torch.Tensor.__dict__["data_ptr"] is _mine
    assert torch.zeros(1).numpy() == "mine"


def test_torchs_method_set_back_by_the_program_inside_a_watch_stays_torchs(tensor_methods: dict[str, Any]) -> None:
    """A program that patches and restores torch's method inside a watch leaves torch's own objects."""
    own = torch.Tensor.__dict__["__array__"]
    with ipd.watch():
        torch.Tensor.__array__ = _mine  # type: ignore[method-assign]
        torch.Tensor.__array__ = own  # type: ignore[method-assign]
        torch.Tensor.numpy = _mine  # type: ignore[method-assign]
        del torch.Tensor.numpy  # back to the inherited one
    assert _same(tensor_methods) == []


def test_a_patch_made_before_a_watch_runs_inside_and_is_the_same_object_after(tensor_methods: dict[str, Any]) -> None:
    """The tool wraps the program's own replacement, which is the program's object again after."""
    calls: list[int] = []

    def users_data_ptr(self: torch.Tensor) -> int:
        calls.append(1)
        return 42

    torch.Tensor.data_ptr = users_data_ptr  # type: ignore[method-assign]
    with ipd.watch():
        assert torch.zeros(2).data_ptr() == 42
    assert torch.Tensor.__dict__["data_ptr"] is users_data_ptr and calls == [1]


def test_monkeypatch_undone_after_the_watch_leaves_torchs_methods_after_the_next_watch(
    tensor_methods: dict[str, Any],
) -> None:
    """pytest's `monkeypatch` inside a watch, undone after it, sets the tool's wrapper back: the next
    watch puts torch's own objects back (the wrapper only passes calls through till then)."""
    patched = pytest.MonkeyPatch()
    with ipd.watch():
        patched.setattr(torch.Tensor, "numpy", _mine)
        patched.setattr(torch.Tensor, "data_ptr", _mine)
        patched.setattr(torch.Tensor, "__iadd__", lambda self, other: self.add_(other))
    patched.undo()
    assert torch.ones(2).numpy().tolist() == [1.0, 1.0]
    with ipd.watch():
        t = torch.zeros(2)
        t += 1
        t.numpy()
    assert _same(tensor_methods) == [] and t.tolist() == [1.0, 1.0]


def test_a_functional_the_program_replaces_inside_a_watch_is_kept() -> None:
    """`F.relu` replaced (the attribute or its code) inside a watch stays the program's; torch's
    function object gets its own code back."""
    torchs, code = F.relu, F.relu.__code__

    def users_relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        return input + 100

    try:
        with ipd.watch():
            F.relu = users_relu
        assert F.relu is users_relu and torchs.__code__ is code
        F.relu = torchs
        with ipd.watch():
            torchs.__code__ = users_relu.__code__
        assert torchs.__code__ is users_relu.__code__ and not hasattr(F, "_inplace_doctor_entry")
        assert F.relu(torch.zeros(1)).tolist() == [100.0]
    finally:
        F.relu = torchs
        torchs.__code__ = code


def test_a_functionals_code_saved_inside_a_watch_and_restored_after_still_runs() -> None:
    """`F.relu.__code__` saved in a watch (the entry code) and set back after still computes relu."""
    code = F.relu.__code__
    try:
        with ipd.watch():
            saved = F.relu.__code__
        F.relu.__code__ = saved
        assert F.relu(-torch.ones(2)).tolist() == [0.0, 0.0]
    finally:
        F.relu.__code__ = code


def _writes_and_hand_outs() -> tuple[list[float], bool, int]:
    """Writes, a hand-out written through, and an in-place error autograd must raise."""
    x = torch.arange(4.0, requires_grad=True)
    y = x.sigmoid()
    version = y._version
    y.mul_(2)
    raised = False
    try:
        y.sum().backward()
    except RuntimeError:
        raised = True
    t = torch.ones(3)
    t.numpy()[0] = 5
    t += 1
    return t.tolist(), raised, y._version - version


@pytest.mark.parametrize("first_ends_first", [True, False])
def test_two_threads_interleaved_compute_as_without_the_tool(
    tensor_methods: dict[str, Any], first_ends_first: bool,
) -> None:
    """Watches of two threads entered and ended in either order compute as plain torch does."""
    expected = _writes_and_hand_outs()
    steps = [threading.Event() for _ in range(4)]  # A in, B in, first out, second out
    got: dict[str, Any] = {}

    def run(name: str, enter_after: int, enter_done: int, leave_after: int, leave_done: int) -> None:
        try:
            if enter_after >= 0:
                assert steps[enter_after].wait(20)
            with ipd.watch():
                got[name + " in"] = _writes_and_hand_outs()
                steps[enter_done].set()
                assert steps[leave_after].wait(20)
                got[name + " late"] = _writes_and_hand_outs()
            steps[leave_done].set()
        except BaseException as exc:  # noqa: BLE001 (checked below)
            got[name] = exc
            for step in steps:
                step.set()

    a_leaves, b_leaves = (1, 2) if first_ends_first else (2, 1)
    threads = [
        threading.Thread(target=run, args=("A", -1, 0, a_leaves, a_leaves + 1)),
        threading.Thread(target=run, args=("B", 0, 1, b_leaves, b_leaves + 1)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {key: expected for key in ("A in", "A late", "B in", "B late")}
    assert _same(tensor_methods) == []


def test_a_watch_ended_by_an_exception_leaves_torchs_methods(tensor_methods: dict[str, Any]) -> None:
    """The program's exception leaves the watch as the program's, torch's methods put back."""
    with pytest.raises(KeyError, match="mine"), ipd.watch():
        torch.ones(2).numpy()
        raise KeyError("mine")
    assert _same(tensor_methods) == [] and F.relu.__code__.co_name == "relu"


def test_pickle_copy_save_and_numpy_round_trips_inside_a_watch_are_plain_torchs() -> None:
    """Serialising, copying and handing out a tensor in a watch gives what it gives without one."""

    def round_trips() -> list[Any]:
        t = torch.arange(4.0)
        buffer = io.BytesIO()
        torch.save(t, buffer)
        buffer.seek(0)
        out = [torch.load(buffer), pickle.loads(pickle.dumps(t)), copy.deepcopy(t), copy.copy(t)]
        out += [torch.from_numpy(t.numpy()), torch.as_tensor(np.asarray(t)), torch.from_numpy(np.from_dlpack(t))]
        return [(o.tolist(), o.dtype, o is t) for o in out]

    plain = round_trips()
    with ipd.watch():
        watched = round_trips()
    assert watched == plain


def test_torchs_patched_functions_pickle_by_reference_inside_a_watch() -> None:
    """`torch.save`, `Tensor.numpy` and kin pickle in a watch (a pool's task) as they do without one."""
    import torch.utils.dlpack as dlpack

    def functions() -> list[Any]:
        return [
            torch.Tensor.numpy, torch.Tensor.data_ptr, torch.Tensor.__array__, torch.Tensor.__dlpack__,
            torch.Tensor.__iadd__, torch.Tensor.detach, torch.Tensor.__deepcopy__, torch.save,
            torch.nn.Module.state_dict, dlpack.to_dlpack, F.relu,
        ]

    def round_trip(function: Any) -> Any:
        try:
            return pickle.loads(pickle.dumps(function)) is function
        except Exception as exc:  # noqa: BLE001 (what pickle raised is the result)
            return type(exc).__name__

    plain = [round_trip(f) for f in functions()]
    with ipd.watch(check_contents=True):
        watched = [round_trip(f) for f in functions()]
    assert watched == plain == [True] * len(plain)


def test_a_hand_out_pytorch_refuses_raises_pytorchs_error_inside_a_watch() -> None:
    """`.numpy()`, `np.asarray`, `__dlpack__` PyTorch refuses raise the same error in a watch."""

    def outcomes() -> list[tuple[str, str]]:
        calls: list[Callable[[], Any]] = [
            lambda: torch.ones(2, requires_grad=True).numpy(),
            lambda: np.asarray(torch.ones(2, requires_grad=True)),
            lambda: torch.ones(2, requires_grad=True).__dlpack__(),
            lambda: torch.ones(2, dtype=torch.bfloat16).numpy(),
            lambda: torch.ones(2, requires_grad=True).numpy(force=True),
        ]
        out = []
        for call in calls:
            try:
                out.append(("returned", str(call())))
            except Exception as exc:  # noqa: BLE001 (the error is the result)
                out.append((type(exc).__name__, str(exc)))
        return out

    plain = outcomes()
    with ipd.watch():
        watched = outcomes()
    assert watched == plain and [kind for kind, _ in plain].count("returned") == 1


def test_a_subclass_overriding_numpy_runs_its_own_inside_a_watch(tensor_methods: dict[str, Any]) -> None:
    """A Tensor subclass's own `numpy` is what its instances call in a watch; torch's is back after."""

    class Sub(torch.Tensor):
        def numpy(self, *args: Any, **kwargs: Any) -> Any:
            return "sub's"

    with ipd.watch():
        assert torch.zeros(2).as_subclass(Sub).numpy() == "sub's"
        assert torch.zeros(2).numpy().tolist() == [0.0, 0.0]
    assert _same(tensor_methods) == []


def _in_child(check: Callable[[], bool], timeout: int = 20) -> int:
    """Runs `check` in an `os.fork()` child that dies after `timeout` s; the child's exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        status = 3
        try:
            signal.alarm(timeout)
            status = 0 if check() else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return status


def _child_computes() -> bool:
    with ipd.watch():  # the child's own session
        inside = _writes_and_hand_outs()
    return inside == _writes_and_hand_outs() == ([6.0, 2.0, 2.0], True, 1)


@pytest.mark.parametrize("while_", ["a watch is open", "the kernels linger"])
def test_a_forked_child_computes_as_plain_torch(monkeypatch: pytest.MonkeyPatch, while_: str) -> None:
    """A child forked in a watch or while the kernels linger writes, raises and hands out as torch does."""
    monkeypatch.setattr(kernel_registration, "LINGER_SECONDS", 600.0)
    try:
        if while_ == "a watch is open":
            with ipd.watch():
                status = _in_child(_child_computes)
        else:
            with ipd.watch():
                pass
            assert registered()
            status = _in_child(lambda: not registered() and _child_computes())
    finally:
        end_linger()
    assert status == 0


def test_a_child_forked_while_another_thread_makes_a_shared_change_can_enter() -> None:
    """A fork while another thread installs a shared patch leaves the child's lock free: it enters."""
    owner = types.SimpleNamespace(f=lambda: "own")
    installing, go_on = threading.Event(), threading.Event()

    def slow(original: Any) -> Any:
        installing.set()
        go_on.wait(20)
        return lambda: "wrapped"

    patch: SharedPatch[object] = SharedPatch(owner, "f", slow)
    installer = threading.Thread(target=patch.acquire, args=(object(),))
    installer.start()
    assert installing.wait(20)
    threading.Timer(0.2, go_on.set).start()  # the fork waits for the change to be made

    def enters() -> bool:
        left = owner.f() == "own"  # the other thread's session is not the child's
        user = object()
        patch.acquire(user)
        inside = owner.f() == "wrapped"
        patch.release(user)
        return left and inside and owner.f() == "own"

    assert _in_child(enters) == 0
    installer.join(20)
    assert owner.f() == "wrapped"


def test_watches_of_many_threads_then_the_linger_leave_no_kernels_and_no_thread_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Watches opened and closed fast in several threads: the kernels are gone after the linger, and
    no thread (the linger timer included) raised."""
    monkeypatch.setattr(kernel_registration, "LINGER_SECONDS", 0.1)
    errors: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    results: list[Any] = []

    def steps() -> None:
        for i in range(15):
            with ipd.watch():
                results.append(_writes_and_hand_outs())
            if i % 5 == 0:
                time.sleep(0.12)  # past the linger: the timer removes, the next watch registers again

    threads = [threading.Thread(target=steps) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    deadline = time.monotonic() + 5
    while registered() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not registered() and errors == []
    assert results == [([6.0, 2.0, 2.0], True, 1)] * 45
    assert not hand_outs.installed()


def test_a_watch_never_exited_leaves_the_program_computing_as_plain_torch() -> None:
    """A session entered and dropped without exit (its patches stay) changes no result of the program."""
    script = textwrap.dedent(
        """
        import gc, torch, inplace_doctor as ipd
        def run():
            torch.manual_seed(0)
            x = torch.randn(5, requires_grad=True)
            y = x.sigmoid() * 3
            y.add_(1)
            y.sum().backward()
            z = x.detach().clone().exp_()
            try:
                s = x.sigmoid(); s.mul_(2); s.sum().backward(); raised = False
            except RuntimeError:
                raised = True
            return x.grad.tolist(), z.numpy().tolist(), raised
        plain = run()
        session = ipd.watch()
        session.__enter__()
        del session
        gc.collect()
        print(run() == plain)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_a_child_forked_while_another_thread_watches_has_torchs_methods_and_no_session() -> None:
    """The other thread's session stays out of a forked child: torch's methods and kernels, no session."""
    before = _torchs()
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with ipd.watch():
            entered.set()
            leave.wait(20)

    watcher = threading.Thread(target=other)
    watcher.start()
    assert entered.wait(20)

    def child() -> bool:
        seen: list[bool] = []

        def new_thread() -> None:  # may reuse the watching thread's id
            t = torch.ones(3)
            t += 1
            seen.append(hand_outs._GROUP.here() == [] and t.tolist() == [2.0, 2.0, 2.0])

        thread = threading.Thread(target=new_thread)
        thread.start()
        thread.join(10)
        clean = _same(before) == [] and not hand_outs.installed() and not registered()
        return seen == [True] and clean and _child_computes()

    try:
        status = _in_child(child)
    finally:
        leave.set()
        watcher.join(20)
    assert status == 0 and _same(before) == []
