"""Models whose entry point is not `nn.Module.__call__` (issue 37, item 3): a class's own `__call__`
(a rollout), `forward` called directly by a wrapper that is no module, `torch.func.functional_call`,
and (`audit`) any callable. A write into the tensor the caller passed is IPD106 as it is for a
hooked call, in both tracers, under `watch`, `audit` and `run`; correct programs stay clean."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import inplace_doctor as ipd

TRACERS = pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])


class Rollout(nn.Module):
    """A policy whose entry point is its own `__call__` (several steps per call); no `forward`."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = nn.Linear(4, 4)

    def __call__(self, obs: torch.Tensor, steps: int = 2) -> torch.Tensor:
        obs[obs < 0] = 0  # the caller's observation, clipped in place
        for _ in range(steps):
            obs = torch.tanh(self.policy(obs))
        return obs


class CleanRollout(Rollout):
    """The same rollout on a copy of the observation: nothing of the caller's is written."""

    def __call__(self, obs: torch.Tensor, steps: int = 2) -> torch.Tensor:
        return super().__call__(obs.clone(), steps)


class ClampThenCall(nn.Module):
    """`__call__` writes its argument, then runs the module's own hooked call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(min=-1.0)
        return super().__call__(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Normalize(nn.Module):
    """A model that writes its input in `forward`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x -= x.mean()
        return self.fc(x)


class Agent:
    """No module: it calls its policy's `forward` directly, as some RL wrappers do."""

    def __init__(self, policy: nn.Module) -> None:
        self.policy = policy

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.forward(obs)


def codes(findings: list[ipd.Finding]) -> list[str]:
    return [f.code for f in findings]


@TRACERS
def test_a_rollout_that_writes_its_observation_in_its_own_call_is_ipd106(deep: bool) -> None:
    model, obs = Rollout(), torch.randn(3, 4)
    with ipd.watch(model, deep=deep) as session:
        model(obs)
    [finding] = session.findings
    assert finding.code == "IPD106"
    assert finding.mutation.line == Rollout.__call__.__code__.co_firstlineno + 1
    assert "argument 0 of Rollout" in finding.what


@TRACERS
def test_a_rollout_built_inside_the_session_is_seen_without_being_given(deep: bool) -> None:
    with ipd.watch(deep=deep) as session:
        model = Rollout()
        model(torch.randn(3, 4))
    assert codes(session.findings) == ["IPD106"]
    assert not session.report().notes


@TRACERS
def test_a_rollout_built_before_an_unnamed_watch_is_seen_from_its_second_call_and_the_report_says_so(deep: bool) -> None:
    model = Rollout()
    with ipd.watch(deep=deep) as session:
        for _ in range(2):
            model(torch.randn(3, 4))
    assert codes(session.findings) == ["IPD106"]
    [note] = session.report().notes
    assert "`Rollout`" in note and "next call" in note and "watch(model)" in note


@TRACERS
def test_a_rollout_on_a_copy_and_a_helper_meant_to_write_stay_clean(deep: bool) -> None:
    def center(batch: torch.Tensor, mean: torch.Tensor) -> None:
        batch -= mean  # the program's own in-place helper

    model = CleanRollout()
    with ipd.watch(model, deep=deep) as session:
        batch = torch.randn(3, 4)
        center(batch, batch.mean(0))
        model(batch)
    assert session.findings == []


@TRACERS
def test_a_call_that_writes_then_calls_its_own_hooked_call_is_one_ipd106(deep: bool) -> None:
    model = ClampThenCall()
    with ipd.watch(model, deep=deep) as session:
        model(torch.randn(3, 4) * 3)
    assert codes(session.findings) == ["IPD106"]
    assert session.findings[0].mutation.line == ClampThenCall.__call__.__code__.co_firstlineno + 1


@TRACERS
def test_a_wrapper_calling_forward_directly_is_a_model_call(deep: bool) -> None:
    policy = Normalize()
    with ipd.watch(policy, deep=deep) as session:
        Agent(policy).act(torch.randn(3, 4))
    assert codes(session.findings) == ["IPD106"]
    assert "argument 0 of Normalize" in session.findings[0].what


@TRACERS
def test_a_forward_called_directly_that_writes_nothing_stays_clean(deep: bool) -> None:
    policy = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with ipd.watch(policy, deep=deep) as session:
        out = Agent(policy).act(torch.randn(3, 4))
        out.sum().backward()
    assert session.findings == []


@TRACERS
def test_functional_call_of_a_model_that_writes_its_input_is_ipd106(deep: bool) -> None:
    model = Normalize()
    params = dict(model.named_parameters())
    with ipd.watch(deep=deep) as session:
        torch.func.functional_call(model, params, (torch.randn(3, 4),))
    assert codes(session.findings) == ["IPD106"]


@TRACERS
def test_audit_of_a_module_with_its_own_call(deep: bool) -> None:
    obs = torch.randn(3, 4)
    before = obs.clone()
    report = ipd.audit(Rollout(), obs, deep=deep)
    assert report.codes == ["IPD106"]
    assert torch.equal(obs, before)  # the caller's tensor restored
    assert ipd.audit(CleanRollout(), obs, deep=deep).codes == []


@TRACERS
def test_the_program_computes_the_same_bits_and_the_class_is_its_own_again(deep: bool) -> None:
    torch.manual_seed(0)
    model, obs = Rollout(), torch.randn(5, 4)
    expected = model(obs.clone())
    policy = Normalize()
    expected_direct = policy.forward(obs.clone())
    with ipd.watch(model, policy, deep=deep):
        assert Rollout.__call__.__wrapped__ is not None  # type: ignore[attr-defined]
        got, got_direct = model(obs.clone()), Agent(policy).act(obs.clone())
    assert torch.equal(got, expected) and torch.equal(got_direct, expected_direct)
    assert "__wrapped__" not in vars(Rollout.__call__) and "__wrapped__" not in vars(Normalize.forward)


_SCRIPT = """
    import torch
    from torch import nn

    class Rollout(nn.Module):
        def __init__(self):
            super().__init__()
            self.policy = nn.Linear(4, 4)

        def __call__(self, obs):
            obs[obs < 0] = 0  # <write>
            return torch.tanh(self.policy(obs))

    class Agent:
        def __init__(self, policy):
            self.policy = policy

        def act(self, obs):
            return self.policy.forward(obs)

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            x.mul_(2)  # <scale>
            return self.fc(x)

    torch.manual_seed(0)
    model, agent = Rollout(), Agent(Scale())
    obs = torch.randn(3, 4)
    print(model(obs.clone()).sum().item(), agent.act(obs.clone()).sum().item())
"""


@TRACERS
def test_run_sees_both_shapes_in_a_script_and_leaves_its_output_alone(tmp_path: Path, deep: bool) -> None:
    script = tmp_path / "rollout.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {**os.environ, "NO_COLOR": "1"}
    run = [sys.executable, "-m", "inplace_doctor", "run", "--deep" if deep else "--fast", str(script)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, env=env)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.stdout == plain.stdout
    lines = {n for n, text in enumerate(script.read_text().splitlines(), 1) if "# <write>" in text or "# <scale>" in text}
    assert done.stderr.count("IPD106") == 2, done.stderr
    assert all(f"rollout.py:{n}" in done.stderr for n in lines), done.stderr


class Policy:
    """A callable that is no module: it writes the observation it is handed, then runs its net."""

    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        obs.clamp_(min=0.0)
        return self.net(obs)

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


NET = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))


def scaled_step(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return NET(x)


def clean_step(x: torch.Tensor) -> torch.Tensor:
    return NET(x * 2)


@TRACERS
def test_audit_takes_a_function_a_callable_object_and_a_method(deep: bool) -> None:
    x = torch.randn(3, 4)
    before, weight = x.clone(), NET[0].weight.detach().clone()
    report = ipd.audit(scaled_step, x, deep=deep)
    assert report.codes == ["IPD106"] and report.target == "scaled_step"
    assert report.findings[0].mutation.line == scaled_step.__code__.co_firstlineno + 1
    assert torch.equal(x, before) and NET[0].weight.grad is None  # input and the global model restored
    assert torch.equal(NET[0].weight, weight) and report.backward
    policy = Policy()
    assert ipd.audit(policy, x, deep=deep).codes == ["IPD106"]
    assert policy.net[0].weight.grad is None  # found through the object's attributes: restored
    assert ipd.audit(clean_step, x, deep=deep).codes == []
    assert ipd.audit(policy.act, x, deep=deep).codes == []


@TRACERS
def test_audit_of_a_models_own_method_other_than_forward(deep: bool) -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def rollout(self, obs: torch.Tensor) -> torch.Tensor:
            obs.sub_(obs.mean())
            return self.fc(obs)

    model = Model()
    report = ipd.audit(model.rollout, torch.randn(3, 4), deep=deep)
    assert report.codes == ["IPD106"] and model.fc.weight.grad is None


def test_audit_refuses_what_cannot_be_called() -> None:
    with pytest.raises(ipd.UsageError, match="needs a torch.nn.Module or a callable, got int"):
        ipd.audit(3, torch.randn(2))  # type: ignore[arg-type]


@TRACERS
def test_a_watch_opened_inside_a_forward_takes_that_forward_for_no_unseen_entry(deep: bool) -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
            with ipd.watch(deep=deep) as session:
                out = self.inner(x)
            return out, session.report().notes

    _, notes = Outer()(torch.randn(3, 4))
    assert notes == []


class FlaggedRollout(nn.Module):
    """Its own `__call__` runs a net whose first layer is `ReLU(inplace=True)`: a write it asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 2))

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


@TRACERS
def test_an_asked_for_write_inside_an_own_call_waits_for_the_callers_read(deep: bool) -> None:
    model = FlaggedRollout()
    with ipd.watch(model, deep=deep) as session:
        obs = torch.randn(3, 4)
        model(obs)
        model(torch.randn(3, 4))  # a temporary: read by no one
        total = obs.sum()  # the caller reads what the ReLU wrote
    assert codes(session.findings) == ["IPD105", "IPD106"]  # as for `model.net(obs)`, a hooked call
    read = session.findings[1].read
    assert read is not None and "total = obs.sum()" in (read.code or "")
    with ipd.watch(model, deep=deep) as session:
        model(torch.randn(3, 4))
    assert session.findings == []
    del total


class FlakyRollout(Rollout):
    """Raises on its first call (the program catches it), then runs as `Rollout`."""

    calls = 0

    def __call__(self, obs: torch.Tensor, steps: int = 2) -> torch.Tensor:
        FlakyRollout.calls += 1
        if FlakyRollout.calls == 1:
            self.policy(obs)
            raise RuntimeError("environment reset")
        return super().__call__(obs, steps)


@TRACERS
def test_a_call_the_program_caught_an_error_of_leaves_the_next_call_seen(deep: bool) -> None:
    FlakyRollout.calls = 0
    model = FlakyRollout()
    with ipd.watch(model, deep=deep) as session:
        with pytest.raises(RuntimeError, match="environment reset"):
            model(torch.randn(3, 4))
        model(torch.randn(3, 4))
    assert codes(session.findings) == ["IPD106"]


class Wrapper(nn.Module):
    """A module that runs its inner model's `forward` directly."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Normalize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.forward(x)


@TRACERS
def test_a_forward_called_directly_inside_a_module_is_named_as_the_inner_module(deep: bool) -> None:
    model = Wrapper()
    with ipd.watch(model, deep=deep) as session:
        model(torch.randn(3, 4))
    [finding] = session.findings
    assert (finding.code, finding.mutation.module, finding.mutation.module_type) == ("IPD106", "inner", "Normalize")


_CLEAN_SCRIPT = """
    import torch
    from torch import nn

    class Rollout(nn.Module):
        def __init__(self):
            super().__init__()
            self.policy = nn.Linear(4, 4)

        def __call__(self, obs):
            obs = obs.clamp(min=0)  # out of place: the caller's observation is left alone
            return torch.tanh(self.policy(obs))

    def center(batch, mean):
        batch -= mean  # the program's own in-place helper

    torch.manual_seed(0)
    model, head = Rollout(), nn.Linear(4, 2)
    obs = torch.randn(3, 4)
    center(obs, obs.mean(0))
    out = head.forward(model(obs))
    out.sum().backward()
    print(out.sum().item(), obs.sum().item())
"""


@TRACERS
def test_run_leaves_a_correct_script_of_both_shapes_clean(tmp_path: Path, deep: bool) -> None:
    script = tmp_path / "clean_rollout.py"
    script.write_text(textwrap.dedent(_CLEAN_SCRIPT))
    env = {**os.environ, "NO_COLOR": "1"}
    run = [sys.executable, "-m", "inplace_doctor", "run", "--deep" if deep else "--fast", str(script)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, env=env)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    assert "0 finding(s)" in done.stderr and "IPD" not in done.stderr, done.stderr
