"""The write kernels' registration lingers after the last session (trace/process/kernel_registration.py).

A `watch` per training step registers the kernels once; they are removed a
moment after the last session, at once by `end_linger()`, at interpreter exit
and in a forked child. Meanwhile writes without a session run PyTorch's own
kernel and are recorded nowhere. What the dispatcher holds is read from
`torch._C._dispatch_dump`, not from the tool's own count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from test_write_kernels import Recorded, _stale_saved_tensor, _writes_of_every_kind
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.trace.fast.write_kernels import (
    WriteKernels,
    end_linger,
    mutating_overloads,
    registered,
    registrations,
)
from inplace_doctor.trace.process import kernel_registration
from inplace_doctor.trace.raised.blame import raised_by_the_tool

SOURCE = kernel_registration.__file__
RACE_CYCLES = 40


def ours_in_dispatcher() -> int:
    """How many aten overloads have a kernel of ours at `ADInplaceOrView`, as the dispatcher says."""
    count = 0
    for op, _, _ in mutating_overloads():
        for line in torch._C._dispatch_dump(op._name).splitlines():
            if line.startswith("ADInplaceOrView:") and SOURCE in line:
                count += 1
    return count


@pytest.fixture
def long_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A linger no slow step outlasts: the tests below end it themselves."""
    monkeypatch.setattr(kernel_registration, "LINGER_SECONDS", 600.0)


def _step(model: nn.Module) -> None:
    with ipd.watch(model, deep=False):
        y = model(torch.randn(2, 4))
        y.sum().backward()


def test_a_watch_per_step_registers_the_kernels_once(long_linger: None) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    before = registrations()
    for _ in range(3):
        _step(model)
    assert registrations() == before + 1
    assert ours_in_dispatcher() == registered() > 1000  # lingering after the last step
    end_linger()
    assert registered() == 0 and ours_in_dispatcher() == 0


def test_the_kernels_are_removed_once_the_linger_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_registration, "LINGER_SECONDS", 0.2)
    with WriteKernels(Recorded()):
        pass
    assert registered() > 1000
    deadline = time.monotonic() + 30
    while registered() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registered() == 0 and ours_in_dispatcher() == 0
    t = torch.zeros(3)
    t.add_(1)
    assert t._version == 1


def test_a_session_within_the_linger_keeps_it_and_the_timer_waits_for_the_last_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernel_registration, "LINGER_SECONDS", 0.3)
    before = registrations()
    for _ in range(4):  # each session ends less than the linger after the previous one began
        with WriteKernels(Recorded()):
            time.sleep(0.1)
    assert registrations() == before + 1 and registered() > 1000
    with WriteKernels(Recorded()):
        time.sleep(0.6)  # past the deadline the last exit set: a held registration is not removed
        assert registered() > 1000


def test_writes_without_a_session_while_lingering_are_not_recorded_and_run_as_pytorchs(long_linger: None) -> None:
    recorded = Recorded()
    with WriteKernels(recorded):
        torch.zeros(2).sub_(1)
    assert registered() > 1000
    worker = threading.Thread(target=lambda: torch.zeros(2).add_(1))
    worker.start()
    worker.join()
    torch.manual_seed(0)
    lingering = _writes_of_every_kind()  # .data, no_grad, out=, index_put_, copy_, set_, foreach
    half = torch.tensor(1.3, dtype=torch.float16)
    half.mul_(2.7)  # a wrapped number: float16 stays float16
    assert registered() > 1000
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _stale_saved_tensor()  # PyTorch's own version bump and error
    assert recorded.ops() == ["aten.sub_.Tensor"]
    end_linger()
    torch.manual_seed(0)
    plain = _writes_of_every_kind()
    plain_half = torch.tensor(1.3, dtype=torch.float16)
    plain_half.mul_(2.7)
    assert [t._version for t in lingering] == [t._version for t in plain]
    assert all(torch.equal(a, b) for a, b in zip(lingering, plain))
    assert half.dtype == torch.float16 and torch.equal(half, plain_half)


def test_pytorchs_error_in_a_write_inside_a_fallthrough_op_stays_the_programs() -> None:
    """`_foreach_add_`'s kernel passes through to per-tensor `add_`, whose kernels take the
    no-session path: PyTorch's error there is the program's, not a crash of the tool."""
    with WriteKernels(Recorded()), \
            pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as info:
        torch._foreach_add_([torch.zeros(1).expand(3)], [torch.ones(3)])
    assert not raised_by_the_tool(info.value)


def test_a_deep_session_ends_the_linger(long_linger: None) -> None:
    model = nn.Linear(4, 4)
    _step(model)
    assert registered() > 1000
    with ipd.watch(model, deep=True):
        assert registered() == 0
        model(torch.randn(2, 4)).sum().backward()


def test_compiled_code_compiled_and_run_while_lingering_matches_eager(long_linger: None) -> None:
    with WriteKernels(Recorded()):
        pass
    torch._dynamo.reset()

    @torch.compile(backend="aot_eager", fullgraph=True)  # fullgraph: a graph break would raise
    def program(x):
        y = x * 2
        y.add_(1)
        return y.sin()

    x = torch.randn(3, requires_grad=True)
    out = program(x)
    assert registered() > 1000
    torch._dynamo.reset()
    assert torch.equal(out, (x.detach() * 2 + 1).sin())


_RACE = """
import sys, threading, time
import torch
from inplace_doctor.trace.process import kernel_registration
from inplace_doctor.trace.fast.write_kernels import WriteKernels, registered

kernel_registration.LINGER_SECONDS = 0.0  # removed at each exit
failures, stop = [], threading.Event()

def write():
    x, y = torch.zeros(2), torch.ones(2)
    try:
        while not stop.is_set():
            x.add_(y)
            x.mul_(y)
            x.copy_(y)
    except BaseException as exc:
        failures.append(repr(exc))

writers = [threading.Thread(target=write) for _ in range(3)]
for writer in writers:
    writer.start()
for _ in range(int(sys.argv[1])):
    with WriteKernels(lambda op, written: None):
        time.sleep(0.002)
stop.set()
for writer in writers:
    writer.join()
print(failures, registered())
"""


def test_threads_writing_while_the_kernels_are_removed_run_undisturbed() -> None:
    """PyTorch frees a removed Python kernel; a thread that looked it up just before and waits for
    the GIL reads it freed (an INTERNAL ASSERT in SafePyObject, the kernel called without its
    keyset, or a crash: in a child process here) unless the holders are kept past the removal."""
    done = subprocess.run(
        [sys.executable, "-c", _RACE, str(RACE_CYCLES)], capture_output=True, text=True, timeout=600,
    )
    assert (done.returncode, done.stdout) == (0, "[] 0\n"), done.stderr[-2000:]


def test_a_forked_child_runs_without_a_lingering_registration(long_linger: None) -> None:
    with WriteKernels(Recorded()):
        pass
    assert registered() > 1000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one line back, then out without running the parent's teardown
        try:
            t = torch.zeros(2)
            t.add_(1)
            message = f"{registered()} {ours_in_dispatcher()} {t._version} {t.tolist()}"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            message = repr(exc)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    assert child == "0 0 1 [1.0, 1.0]"
    assert registered() > 1000  # the parent's linger goes on


class _RegisteredInWorker(torch.utils.data.Dataset):
    """Each item: how many of our kernels the worker process has registered, and a write's version."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        t = torch.zeros(1)
        t.add_(1)
        return torch.tensor([registered(), t._version])


def test_a_forked_dataloader_worker_writes_without_the_lingering_kernels(long_linger: None) -> None:
    with WriteKernels(Recorded()):
        pass
    loader = torch.utils.data.DataLoader(
        _RegisteredInWorker(), batch_size=None, num_workers=1, multiprocessing_context="fork",
    )
    assert [item.tolist() for item in loader] == [[0, 1], [0, 1]]
    assert registered() > 1000


def test_the_process_exits_at_once_and_the_kernels_are_gone_at_exit() -> None:
    script = textwrap.dedent(
        """
        import atexit
        import torch
        atexit.register(lambda: print("at exit:", registered(), flush=True))  # runs after the tool's own
        from inplace_doctor.trace.process import kernel_registration
        from inplace_doctor.trace.fast.write_kernels import WriteKernels, registered
        kernel_registration.LINGER_SECONDS = 60.0
        with WriteKernels(lambda op, written: None):
            torch.zeros(2).add_(1)
        print("lingering:", registered() > 1000, flush=True)
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["lingering: True", "at exit: 0"]
    assert time.monotonic() - started < 60  # the daemon timer did not hold the process for its linger



def test_a_watch_per_step_wakes_the_linger_timer_at_most_once(long_linger: None) -> None:
    from inplace_doctor.trace.fast.write_kernels import _REGISTRATION

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    _step(model)
    _step(model)  # the timer waits for a deadline at most this exit's
    before = _REGISTRATION.wake_ups
    for _ in range(5):
        _step(model)
    assert _REGISTRATION.wake_ups - before <= 1
    end_linger()

def test_a_timer_parked_while_a_session_outlasted_the_linger_removes_the_kernels_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernel_registration, "LINGER_SECONDS", 0.2)
    with WriteKernels(Recorded()):
        pass
    with WriteKernels(Recorded()):
        time.sleep(0.5)  # the earlier deadline passes with this session in: the timer parks
    deadline = time.monotonic() + 30
    while registered() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registered() == 0 and ours_in_dispatcher() == 0
