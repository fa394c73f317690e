"""The program sees PyTorch's own exception under the tool (issue 37, item 2).

The tool's saved-tensor hooks switch autograd's version check off, so the tool raises the stale
saved tensor error itself. What the program catches must be what PyTorch raises without the
tool: its type (`RuntimeError`, not a subclass) and its message, word for word. The tool's
diagnosis rides on it and only leaves a watch (as `InplaceError`) when the program did not catch it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

import inplace_doctor as ipd
from inplace_doctor.errors import tool_error_of


class _SaveInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return g * x


def _output_saved() -> None:  # ExpBackward0 saves its result
    x = torch.randn(3, 4, requires_grad=True)
    y = x.exp()
    y.add_(1)
    y.sum().backward()


def _input_saved_then_rebased() -> None:  # mm saves h; h.add_ makes h an output of AddBackward0
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    h = x * 2
    out = h @ w
    h.add_(1)
    out.sum().backward()


def _leaf_written_under_no_grad() -> None:  # a leaf: PyTorch names no node
    x = torch.randn(3, 4, requires_grad=True)
    y = x.sin()
    with torch.no_grad():
        x.add_(1)
    y.sum().backward()


def _setitem_on_a_saved_output() -> None:
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    z = torch.tanh(x)
    z[0] = 1
    z.sum().backward()


def _view_of_one_of_several() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    _, b = (x * 1).unbind(1)[1:3]
    y = b.exp()
    y.add_(1)
    y.sum().backward()


def _custom_function_saves_its_input() -> None:
    x = torch.randn(4, requires_grad=True)
    h = x * 1
    y = _SaveInput.apply(h)
    with torch.no_grad():
        h.mul_(3)
    y.sum().backward()


def _module_relu_after_sigmoid() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU(inplace=True))
    model(torch.randn(2, 4)).sum().backward()


def _optimizer_step_before_second_backward() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    first, second = model(x).sum(), model(x).sum()
    first.backward()
    opt.step()
    second.backward()


def _leaky_relu_then_dropout_in_place() -> None:  # LeakyReluBackward1: torch says `LeakyRelu1`
    model = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2, inplace=True), nn.Dropout(0.3, inplace=True))
    model(torch.randn(2, 4)).sum().backward()


def _pow_of_a_scalar_base() -> None:  # PowBackward2
    x = torch.rand(3, requires_grad=True)
    z = torch.pow(2.0, x)
    z.add_(1)
    z.sum().backward()


def _under_anomaly_mode() -> None:
    with torch.autograd.set_detect_anomaly(True):
        _output_saved()


PROGRAMS: dict[str, Callable[[], None]] = {
    f.__name__.strip("_"): f
    for f in (
        _output_saved, _input_saved_then_rebased, _leaf_written_under_no_grad, _setitem_on_a_saved_output,
        _view_of_one_of_several, _custom_function_saves_its_input, _module_relu_after_sigmoid,
        _optimizer_step_before_second_backward, _leaky_relu_then_dropout_in_place, _pow_of_a_scalar_base,
        _under_anomaly_mode,
    )
}


def _raised(program: Callable[[], None]) -> RuntimeError:
    torch.manual_seed(0)
    with pytest.raises(RuntimeError) as raised, pytest.warns() if program is _under_anomaly_mode else _nothing():
        program()
    return raised.value


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_program_catches_pytorchs_error_word_for_word(name: str, deep: bool) -> None:
    program = PROGRAMS[name]
    plain = _raised(program)
    with ipd.watch(deep=deep) as session:
        watched = _raised(program)  # caught inside the watch, as the program's own `except` would
    assert type(watched) is type(plain) is RuntimeError
    assert str(watched) == str(plain)
    assert watched.__cause__ is None and not getattr(watched, "__notes__", None)
    # The diagnosis is the tool's, beside it: the finding names both lines.
    assert tool_error_of(watched) is not None
    assert [f.code for f in session.findings if f.confirmed] == ["IPD101"]


def test_uncaught_it_leaves_the_watch_as_inplace_error_from_pytorchs() -> None:
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch():
        _output_saved()
    cause = raised.value.__cause__
    assert type(cause) is RuntimeError and "which is output 0 of Exp," in str(cause)
    assert isinstance(cause.__cause__, ipd.WrittenHere)  # where the write ran, printed first
    assert raised.value.findings[0].code == "IPD101"


_SCRIPT = """
import torch
torch.manual_seed(0)
x = torch.randn(4, requires_grad=True)
h = torch.sigmoid(x)
h.mul_(2)
try:
    h.sum().backward()
except RuntimeError as e:
    print("caught:", type(e).__name__, e)
    print("args:", e.args)
print("went on")
"""


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_a_script_that_prints_the_caught_error_prints_the_same_under_run(tmp_path, deep: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    argv = [sys.executable, "-m", "inplace_doctor", "run", *(["--deep"] if deep else []), str(script)]
    tool = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "caught: RuntimeError one of the variables" in plain.stdout
    assert tool.stdout == plain.stdout  # the script's own output, byte for byte
    assert "IPD101" in tool.stderr and tool.returncode == 1  # the finding is still the tool's to report
