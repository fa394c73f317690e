"""Process-wide patches shared by sessions (`trace/process/shared_patches.py`): grouped, and their wrappers
made once per value they wrap, yet always wrapping what the attribute holds when a session begins."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.trace.process.shared_patches import ABSENT, SharedGroup, SharedPatch


def _counting(calls: list[str]) -> Any:
    def wrap(original: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            calls.append("wrapper")
            return original(*args)

        return wrapper

    return wrap


def test_a_wrapper_wraps_the_value_the_attribute_holds_when_the_first_session_enters() -> None:
    owner = types.SimpleNamespace(f=torch.zeros)
    calls: list[str] = []
    patch: SharedPatch[object] = SharedPatch(owner, "f", _counting(calls))
    user = object()
    patch.acquire(user)
    first_wrapper = owner.f
    assert owner.f(1).tolist() == [0.0]
    patch.release(user)
    patch.acquire(user)
    assert owner.f is first_wrapper  # torch's same function: the wrapper made for it is set again
    patch.release(user)
    owner.f = torch.ones  # changed between sessions (another tool's patch, a reload)
    patch.acquire(user)
    assert owner.f is not first_wrapper and owner.f(1).tolist() == [1.0]
    patch.release(user)
    owner.f = lambda n: "a user's"
    patch.acquire(user)
    assert owner.f(1) == "a user's"
    patch.release(user)
    assert owner.f(1) == "a user's" and calls == ["wrapper", "wrapper", "wrapper"]


def test_a_wrapped_function_is_not_kept_alive_by_the_patch() -> None:
    import gc
    import weakref

    def own() -> str:
        return "own"

    owner = types.SimpleNamespace(f=own)
    patch: SharedPatch[object] = SharedPatch(owner, "f", lambda original: (lambda: original()))
    user = object()
    patch.acquire(user)
    patch.release(user)
    gone = weakref.ref(own)
    del own, owner.f
    gc.collect()
    assert gone() is None


def test_an_inherited_method_is_wrapped_as_inherited_now() -> None:
    class Base:
        def f(self) -> str:
            return "base"

    class Owner(Base):
        pass

    calls: list[str] = []
    patch: SharedPatch[object] = SharedPatch(Owner, "f", lambda own: _counting(calls)(Base.f if own is ABSENT else own))
    user = object()
    patch.acquire(user)
    patch.release(user)
    assert "f" not in Owner.__dict__
    Base.f = lambda self: "changed"  # type: ignore[method-assign]
    patch.acquire(user)
    try:
        assert Owner().f() == "changed"
    finally:
        patch.release(user)


def test_a_group_installs_its_parts_together_and_each_part_knows_the_sessions() -> None:
    owner = types.SimpleNamespace(f=lambda: "f", g=lambda: "g")
    parts: list[SharedPatch[object]] = [SharedPatch(owner, n, lambda o: (lambda: o() + "!")) for n in ("f", "g")]
    group: SharedGroup[object] = SharedGroup(list(parts))
    first, second = object(), object()
    group.acquire(first)
    group.acquire(second)
    assert owner.f() == "f!" and owner.g() == "g!"
    assert parts[0].users == parts[1].users == [first, second] == parts[1].here()
    group.release(first)
    assert owner.f() == "f!" and parts[0].users == [second]
    group.release(second)
    assert owner.f() == "f" and owner.g() == "g" and parts[0].users == []


def test_a_group_whose_part_fails_to_install_undoes_the_parts_made() -> None:
    owner = types.SimpleNamespace(f=lambda: "f")

    def broken(original: Any) -> Any:
        raise RuntimeError("cannot wrap")

    group: SharedGroup[object] = SharedGroup(
        [SharedPatch(owner, "f", lambda o: (lambda: "wrapped")), SharedPatch(owner, "g", broken)]
    )
    with pytest.raises(RuntimeError):
        group.acquire(object())
    assert owner.f() == "f" and not hasattr(owner, "g") and group.users == []


def test_augmented_assignment_is_seen_after_torchs_method_changed_between_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wrappers of `torch.Tensor.__iadd__` are reused while it is torch's: another tool's
    patch set between two sessions is what the next session's wrapper calls."""
    with ipd.watch():
        pass
    seen: list[str] = []
    torchs = torch.Tensor.__iadd__

    def other_tools(self: torch.Tensor, other: Any) -> torch.Tensor:
        seen.append("other tool")
        return torchs(self, other)

    monkeypatch.setattr(torch.Tensor, "__iadd__", other_tools)
    with ipd.watch():
        t = torch.zeros(2)
        t += 1
    assert seen == ["other tool"] and t.tolist() == [1.0, 1.0]
    assert torch.Tensor.__dict__["__iadd__"] is other_tools


def test_torch_to_dlpack_follows_the_dlpack_modules_function_as_it_is_when_the_session_begins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`torch.to_dlpack` is set to the wrapper of `torch.utils.dlpack.to_dlpack`: when another tool
    replaced that function between sessions, both names call the replacement in the next session."""
    import torch.utils.dlpack as dlpack

    if torch.__dict__.get("to_dlpack") is not dlpack.to_dlpack:
        pytest.skip("torch.to_dlpack is not torch.utils.dlpack.to_dlpack on this torch")
    with ipd.watch():
        torch.to_dlpack(torch.zeros(2))
    seen: list[str] = []
    torchs = dlpack.to_dlpack

    def other_tools(tensor: torch.Tensor) -> Any:
        seen.append("other tool")
        return torchs(tensor)

    monkeypatch.setattr(dlpack, "to_dlpack", other_tools)
    with ipd.watch():
        torch.to_dlpack(torch.zeros(2))
    assert seen == ["other tool"]
