"""Sessions leave the process as they found it: every patch, hook and mode is torch's own again after.

Whatever order sessions end in: one; nested in one thread; two threads in both end orders (the first
to start ends first, or last); an exception inside; each kind (`_no_leftovers.SESSIONS`: the fast
and deep tracer, `check_contents`, `audit`), and two kinds side by side. The snapshot is the full
one (`Leftovers.take`: every attribute of torch's modules and classes, the hook and mode state).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _no_leftovers import SESSIONS, Leftovers, leftovers, touched, warm_up

KINDS = sorted(SESSIONS)
Session = Callable[[Callable[[], None]], None]


@pytest.fixture(autouse=True, scope="module")
def _warm() -> None:
    warm_up()


def _thread_state() -> dict[str, Any]:
    """What a thread's own stacks hold (its dispatch and function modes, saved-tensor and node hooks)."""
    state = Leftovers.take().state
    return {k: v for k, v in state.items() if "thread" in k}


def _two_threads(first: Session, second: Session, first_ends_first: bool) -> list[str]:
    """`first` enters in one thread, then `second` in another; they end in the order asked. Returns
    what each thread's own state kept after its session ("" when nothing)."""
    entered = [threading.Event(), threading.Event()]
    ended = [threading.Event(), threading.Event()]
    kept = ["", ""]
    errors: list[BaseException] = []

    def run(me: int, session: Session, waits_for_end: bool) -> None:
        other = 1 - me
        before = _thread_state()

        def inside() -> None:
            entered[me].set()
            assert entered[other].wait(60)
            if waits_for_end:
                assert ended[other].wait(60)

        try:
            session(inside)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(exc)
        finally:
            ended[me].set()
        after = _thread_state()
        kept[me] = "" if after == before else f"{before} -> {after}"

    threads = [
        threading.Thread(target=run, args=(0, first, not first_ends_first)),
        threading.Thread(target=run, args=(1, second, first_ends_first)),
    ]
    threads[0].start()
    assert entered[0].wait(60)  # the first session is in before the second starts
    threads[1].start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return kept


def _clean(before: Leftovers) -> None:
    __tracebackhide__ = True
    found = leftovers(before)
    assert not found, "left behind:\n" + "\n".join(found)


@pytest.mark.parametrize("kind", KINDS)
def test_one_session(kind: str) -> None:
    before = Leftovers.take()
    SESSIONS[kind](lambda: None)
    _clean(before)


@pytest.mark.parametrize("kind", KINDS)
def test_nested_sessions(kind: str) -> None:
    before = Leftovers.take()
    inner = SESSIONS["watch (fast)" if kind != "watch (fast)" else "watch (deep)"]
    SESSIONS[kind](lambda: inner(lambda: None))
    _clean(before)


@pytest.mark.parametrize("first_ends_first", [True, False], ids=["first-ends-first", "first-ends-last"])
@pytest.mark.parametrize("kind", KINDS)
def test_sessions_of_two_threads_in_either_end_order(kind: str, first_ends_first: bool) -> None:
    before = Leftovers.take()
    kept = _two_threads(SESSIONS[kind], SESSIONS[kind], first_ends_first)
    assert kept == ["", ""]
    _clean(before)


@pytest.mark.parametrize("first_ends_first", [True, False], ids=["first-ends-first", "first-ends-last"])
@pytest.mark.parametrize(
    "kinds", [("watch (fast)", "watch (deep)"), ("watch (deep)", "watch (check_contents)"), ("audit", "watch (fast)")]
)
def test_sessions_of_two_kinds_in_two_threads(kinds: tuple[str, str], first_ends_first: bool) -> None:
    before = Leftovers.take()
    kept = _two_threads(SESSIONS[kinds[0]], SESSIONS[kinds[1]], first_ends_first)
    assert kept == ["", ""]
    _clean(before)


class _Raised(Exception):
    pass


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_inside(kind: str) -> None:
    def inside() -> None:
        raise _Raised("inside the session")

    before = Leftovers.take()
    with pytest.raises(Exception, match="inside the session"):  # audit wraps it in a ModelError
        SESSIONS[kind](inside)
    _clean(before)


def test_the_checker_sees_a_patch_left_behind() -> None:
    """A patch of the kind sessions make, left in place, is found (the checker can fail)."""
    assert any(ns is torch.Tensor and "detach" in names for ns, names in touched())
    before, quick = Leftovers.take(), Leftovers.quick()
    own = torch.Tensor.detach
    torch.Tensor.detach = lambda t: own(t)  # type: ignore[method-assign, assignment, misc]
    try:
        assert [f for f in leftovers(before) if f.startswith("torch.Tensor.detach")]
        assert [f for f in leftovers(quick) if f.startswith("torch.Tensor.detach")]
    finally:
        torch.Tensor.detach = own  # type: ignore[method-assign]
    _clean(before)


def test_the_checker_sees_a_mode_or_a_hook_left_behind() -> None:
    before = Leftovers.quick()
    torch._C._autograd._push_node_creation_hook(lambda node: None)
    assert leftovers(before) == ["node-creation hooks on this thread: 0 -> 1"]  # and popped by looking
    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    hooks.__enter__()
    try:
        assert leftovers(before) == ["saved-tensor hooks on this thread: False -> True"]
    finally:
        hooks.__exit__(None, None, None)
    _clean(before)


def test_the_session_left_in_still_sees_what_the_shared_wrappers_report() -> None:
    """Thread B's session, entered after A's: its `state_dict()` and `to_dlpack` are seen by B's
    session only while A's is in, and still after A's has ended (the wrappers are shared, and tell
    the sessions of the calling thread)."""
    import inplace_doctor as ipd

    warm_up()
    before = Leftovers.take()
    b_called, a_out = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def b() -> None:
        model = torch.nn.Linear(2, 2)
        with ipd.watch(check_contents=True) as session:
            for phase in ("A in", "A out"):
                if phase == "A out":
                    assert a_out.wait(60)
                model.state_dict()
                torch.utils.dlpack.to_dlpack(torch.randn(3))
                seen[phase] = (
                    sum(len(entries) for entries in session.tracer.held.by_storage.values()),
                    sorted(e.method for es in session.tracer.contents.by_storage.values() for e in es),
                )
                b_called.set()

    worker = threading.Thread(target=b)
    with ipd.watch(check_contents=True) as first:
        worker.start()
        assert b_called.wait(60)
        seen["A"] = (len(first.tracer.held.by_storage), len(first.tracer.contents.by_storage))
    a_out.set()
    worker.join(60)
    # B: the weight and the bias held, then again; one to_dlpack, then two. A: none of B's calls
    assert seen == {"A in": (2, ["to_dlpack"]), "A": (0, 0), "A out": (4, ["to_dlpack", "to_dlpack"])}
    _clean(before)
