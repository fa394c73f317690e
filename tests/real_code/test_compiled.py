"""`torch.compile`d and TorchScript code under audit, watch and run: traced eagerly, named as written.

The scripts are the common shape of a training script that compiles its model
(`model = torch.compile(Net())`, then a plain loop), with and without a real bug.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from conftest import marker_line
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.trace.process.compiled import EagerCompiled

TRAIN = textwrap.dedent(
    """\
    import sys
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, buggy):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.gate = nn.Sigmoid()
            self.fc2 = nn.Linear(16, 1)
            self.buggy = buggy

        def forward(self, x):
            h = self.gate(self.fc1(x))  # SigmoidBackward0 saves its output
            if self.buggy:
                h += 1  # ... which this overwrites
            else:
                h = h + 1
            return self.fc2(h)


    torch.manual_seed(0)
    model = WRAP(Net(buggy="--bug" in sys.argv))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.randn(4, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("trained", round(loss.item(), 6))
    """
)
SAVE_LINE = 15  # `h = self.gate(self.fc1(x))`
WRITE_LINE = 17  # `h += 1`


def run_script(tmp_path: Path, wrap: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("WRAP", wrap))
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--steps", "1", "train.py", *args],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def test_a_compiled_model_with_a_bug_is_named_with_both_lines_under_run(tmp_path: Path) -> None:
    done = run_script(tmp_path, "torch.compile", "--bug")
    assert done.returncode == 1, done.stderr
    assert "UnsupportedModuleError" not in done.stderr
    assert f"overwritten `add_` in model (Net) at train.py:{WRITE_LINE}" in done.stderr
    assert f"SigmoidBackward0.result in model.gate (Sigmoid) at train.py:{SAVE_LINE}" in done.stderr
    assert f"fix: replace `h += 1` with `h = h + 1` at train.py:{WRITE_LINE}" in done.stderr
    assert "1 call into torch.compile'd code ran eagerly while traced" in done.stderr


def test_a_correct_compiled_script_trains_to_the_end_and_compiles_after_the_watched_step(tmp_path: Path) -> None:
    done = run_script(tmp_path, "torch.compile")
    assert done.returncode == 0, done.stderr
    plain = subprocess.run(
        [sys.executable, "train.py"], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stderr
    assert done.stdout.startswith("trained ") and plain.stdout.startswith("trained ")
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith("inplace-doctor: 0 finding(s); watched 1 optimizer step"), done.stderr
    assert "1 torch.compile'd call(s) ran eagerly while watched, compiled as usual after" in summary
    # Our global module hooks would make OptimizedModule warn on every call: not the user's warning.
    assert "global hooks on modules" not in done.stderr


def test_a_scripted_model_runs_with_a_note_and_pytorch_jit_0_names_both_lines(tmp_path: Path) -> None:
    done = run_script(tmp_path, "torch.jit.script", "--bug")
    assert done.returncode == 1, done.stderr
    assert "UnsupportedModuleError" not in done.stderr
    assert "IPD101" in done.stderr
    assert "TorchScript module `Net` ran while traced" in done.stderr and "PYTORCH_JIT=0" in done.stderr
    eager = run_script(tmp_path, "torch.jit.script", "--bug", env={"PYTORCH_JIT": "0"})
    assert eager.returncode == 1, eager.stderr
    assert f"overwritten `add_` in model (Net) at train.py:{WRITE_LINE}" in eager.stderr
    assert f"at train.py:{SAVE_LINE}" in eager.stderr


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.fc(x))
        y.mul_(2)  # overwrites what SigmoidBackward0 saved
        return y


def test_audit_of_a_compiled_module_names_the_modules_as_written() -> None:
    model = Gate()
    report = ipd.audit(torch.compile(model), torch.randn(2, 4))
    [f] = report.findings
    assert f.code == "IPD101" and f.confirmed
    assert f.saved is not None and f.saved.module == "act"  # not _orig_mod.act
    assert "_orig_mod" not in str(report) and "model.act (Sigmoid)" in str(report)
    assert report.stats["compiled_calls_run_eagerly"] == 1
    assert any("ran eagerly while traced" in note for note in report.notes)


def test_a_compiled_function_is_traced_eagerly_and_compiles_after_watch() -> None:
    calls = []

    def backend(gm, example_inputs):  # a counting backend: no inductor build in the test
        calls.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def gate(x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        s.mul_(2)
        return s

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ipd.InplaceError, match="SigmoidBackward0"), ipd.watch() as session:
        gate(x).sum().backward()
    assert calls == []  # nothing compiled inside the watched window
    [f] = session.findings
    assert f.code == "IPD101"
    assert f.mutation.code == "s.mul_(2)" and f.saved is not None and f.saved.code == "s = torch.sigmoid(x)"
    with pytest.raises(Exception, match="modified by an inplace operation"):
        gate(torch.randn(3, requires_grad=True)).sum().backward()
    assert len(calls) == 1  # compiled as usual once watch() is done


def test_eager_compiled_restores_the_stance_and_only_its_own_warning_filter() -> None:
    from torch._dynamo import eval_frame

    before_filters = list(warnings.filters)
    before_lookup = eval_frame._callback_from_stance
    with EagerCompiled():
        assert eval_frame._stance.stance == "force_eager"
        warnings.filterwarnings("ignore", message="the user's own filter")
        users = warnings.filters[0]
    assert eval_frame._stance.stance == "default"
    assert eval_frame._callback_from_stance is before_lookup
    assert users in warnings.filters  # added by the program meanwhile: kept
    warnings.filters.remove(users)
    assert warnings.filters == before_filters


def test_outputs_and_gradients_match_eager_with_and_without_the_tool() -> None:
    class Clean(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x)).square()

    torch.manual_seed(1)
    model, x = Clean(), torch.randn(3, 4)
    eager = model(x)
    eager.sum().backward()
    eager_grad = model.fc.weight.grad.clone()
    model.zero_grad()
    compiled = torch.compile(model, backend="eager")
    with ipd.watch(compiled) as session:
        out = compiled(x)
        out.sum().backward()
    assert session.findings == []
    assert torch.equal(out, eager) and torch.equal(model.fc.weight.grad, eager_grad)


class Encoder(nn.Module):
    """Returns `relu`'s output, which eager autograd saves and inductor does not (it keeps its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _shift_after_forward(model: nn.Module, x: torch.Tensor, inplace: bool) -> None:
    h = model(x)
    if inplace:
        h -= 0.5  # written after the compiled forward returned  # <shift>
    else:
        h = h - 0.5
    h.square().mean().backward()


def test_pytorch_fact_inductor_runs_on_where_eager_raises_with_the_out_of_place_gradients() -> None:
    """The fact IPD101's note on compiled code rests on (torch 2.14.1, CPU, inductor): a write after a
    compiled forward into `relu`'s output raises eagerly; compiled, backward reads inductor's own saved
    tensors, so the program runs on, with the gradients of the out-of-place program."""
    torch.manual_seed(0)
    base, x = Encoder(), torch.randn(4, 8)
    reference = Encoder()
    reference.load_state_dict(base.state_dict())
    _shift_after_forward(reference, x.clone(), inplace=False)
    eager = Encoder()
    eager.load_state_dict(base.state_dict())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _shift_after_forward(eager, x.clone(), inplace=True)
    torch._dynamo.reset()
    compiled = Encoder()
    compiled.load_state_dict(base.state_dict())
    _shift_after_forward(torch.compile(compiled), x.clone(), inplace=True)  # inductor: no error
    torch._dynamo.reset()
    for p, q in zip(compiled.parameters(), reference.parameters()):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)


def test_a_save_inside_compiled_code_is_marked_so_the_finding_says_what_compiled_code_does() -> None:
    model = Encoder()
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch():
        _shift_after_forward(torch.compile(model, backend="eager"), torch.randn(4, 8), inplace=True)
    [f] = raised.value.findings
    assert f.code == "IPD101" and f.confirmed and f.saved is not None
    assert f.saved.in_compiled and not f.mutation.in_compiled  # saved in the compiled forward, written after it
    assert f.mutation.line == marker_line(__file__, "shift")


def test_a_save_and_a_write_both_inside_compiled_code_are_both_marked() -> None:
    compiled = torch.compile(Gate(), backend="eager")
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch():
        compiled(torch.randn(2, 4)).sum().backward()
    [f] = raised.value.findings
    assert f.saved is not None and f.saved.in_compiled and f.mutation.in_compiled


def test_a_save_outside_compiled_code_is_not_marked() -> None:
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch():
        _shift_after_forward(Encoder(), torch.randn(4, 8), inplace=True)
    [f] = raised.value.findings
    assert f.saved is not None and not f.saved.in_compiled and not f.mutation.in_compiled
