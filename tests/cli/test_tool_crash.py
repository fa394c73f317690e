"""Whose exception is it: a crash inside inplace-doctor says so (exit 4, the versions, a request
to report it), never as the model's; the model's own errors, including PyTorch's raised at the
model's call and passed on by the tool's modes and hooks, stay the model's (exit 3). Ctrl-C is
exit 130. Models on the meta device, and inputs made under `torch.inference_mode()`, get the
right one line."""

from __future__ import annotations

import functools
import operator

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import __version__
from inplace_doctor.cli.main import main
from inplace_doctor.errors import InternalError, ModelError, UsageError
from inplace_doctor.trace.saves import saved

FACTORY_MODULE = "ipd_tool_crash_factories"
FACTORY_SOURCE = '''
import torch
from torch import nn


class BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad[:1]  # the wrong shape: autograd's C++ engine raises in backward


class BadBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return BadGrad.apply(self.fc(x))


def bad_backward():
    return BadBackward(), torch.randn(3, 4)


def wrong_shape():
    return nn.Linear(4, 4), torch.randn(3, 5)  # torch's own module, raising in C++ at the call


class Interrupted(nn.Module):
    def forward(self, x):
        raise KeyboardInterrupt


def interrupted():
    return Interrupted(), torch.randn(2, 4)


def on_meta():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)).to("meta"), torch.randn(2, 8, device="meta")


def inference_input():
    with torch.inference_mode():
        x = torch.randn(2, 8)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU()), x
'''
COMMANDS = ["audit", "verify", "memory", "optimize"]


@pytest.fixture
def factories(factory_module):
    factory_module(FACTORY_MODULE, FACTORY_SOURCE)


@pytest.fixture
def tracer_fault(monkeypatch):
    """A fault in the tool's own code: the saved-tensor hook fails on every save (a C-level
    ZeroDivisionError raised on the tool's own line, as a real bug would): the pack both tracers
    share asks whether a dispatch mode is on before it detaches."""
    monkeypatch.setattr(saved, "_dispatch_modes", functools.partial(operator.truediv, 1, 0))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_fault_in_the_tracer_is_the_tools_crash_with_versions_exit_4(capsys, tracer_fault):
    code, out, err = run_cli(capsys, "audit", "inplace_doctor.examples:sigmoid_then_relu")
    assert code == 4, err
    assert out == ""
    assert "Traceback" in err and "saved.py" in err  # the crash's own traceback
    last = err.splitlines()[-1]
    assert last.startswith("inplace-doctor failed: ZeroDivisionError")
    assert f"inplace-doctor {__version__}" in last and f"torch {torch.__version__}" in last
    assert "not in your code" in last and "report" in last
    assert "raised ZeroDivisionError during" not in err  # never blamed on the model


def test_a_fault_in_the_tracer_under_run_is_the_tools_crash(capsys, tracer_fault, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(4, 4)\nm(torch.randn(2, 4)).sum().backward()\n", encoding="utf-8"
    )
    code, out, err = run_cli(capsys, "run", str(script))
    assert code == 4, err
    assert err.splitlines()[-1].startswith("inplace-doctor failed: ZeroDivisionError")


def test_a_fault_in_the_tracer_raises_internal_error_from_the_api(tracer_fault):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    with pytest.raises(InternalError, match="inplace-doctor failed: ZeroDivisionError") as info:
        ipd.audit(model, torch.randn(2, 4))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(InternalError), ipd.watch():
        model(torch.randn(2, 4)).sum().backward()


def test_a_correct_model_still_audits_after_a_fault_was_removed(tracer_fault, monkeypatch):
    with pytest.raises(InternalError):
        ipd.audit(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()), torch.randn(2, 4))
    monkeypatch.undo()  # the fault gone: nothing of the crashed run is left installed
    assert ipd.audit(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()), torch.randn(2, 4)).codes == []


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("factory", ["wrong_shape", "bad_backward"])
def test_pytorchs_error_at_the_models_call_stays_the_models(capsys, factories, command, factory):
    """Raised in C++ below the tool's dispatch mode, or by autograd's engine below the tool's
    `backward()` call: the model's error (exit 3), not the tool's crash."""
    code, out, err = run_cli(capsys, command, f"{FACTORY_MODULE}:{factory}")
    assert code == 3, err
    last = err.splitlines()[-1]
    assert last.startswith("inplace-doctor: ") and " raised RuntimeError during " in last, last
    assert "inplace-doctor failed" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_is_exit_130_with_one_line(capsys, factories, command):
    code, out, err = run_cli(capsys, command, f"{FACTORY_MODULE}:interrupted")
    assert code == 130
    assert err == "inplace-doctor: interrupted\n"


def test_ctrl_c_in_run_is_130_with_the_scripts_traceback_only(capsys, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        "def train():\n"
        "    m(torch.randn(2, 4)).sum().backward()\n"
        "    raise KeyboardInterrupt  # Ctrl-C, mid-loop\n"
        "train()\n",
        encoding="utf-8",
    )
    code, out, err = run_cli(capsys, "run", str(script))
    assert code == 130, err
    assert "KeyboardInterrupt" in err and "loop.py\", line 6" in err and "line 5, in train" in err
    assert "inplace_doctor" not in err.split("KeyboardInterrupt")[0]  # no frame of the tool
    assert err.splitlines()[-1].startswith("inplace-doctor: 0 finding(s)")  # the findings still printed


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_on_the_meta_device_is_one_usage_line(capsys, factories, command):
    code, out, err = run_cli(capsys, command, f"{FACTORY_MODULE}:on_meta")
    assert code == 2, err
    [line] = err.splitlines()
    assert f"{command} needs real tensors" in line and "meta device" in line and "to_empty(device='cpu')" in line


@pytest.mark.parametrize("job", [ipd.audit, ipd.verify, ipd.memory, ipd.optimize])
def test_a_model_on_the_meta_device_is_a_usage_error_in_the_api(job):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)).to("meta")
    with pytest.raises(UsageError, match="meta device"):
        job(model, torch.randn(2, 8, device="meta"))


def test_audit_names_the_one_meta_tensor_a_real_model_or_its_input_holds():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    model[1].register_buffer("extra", torch.zeros(2, device="meta"))
    with pytest.raises(UsageError, match=r"but Sequential\.1\.extra is on the meta device"):
        ipd.audit(model, torch.randn(2, 8))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[1].weight = nn.Parameter(torch.zeros(8, 8, device="meta"))
    with pytest.raises(UsageError, match=r"but Sequential\.1\.weight is on the meta device"):
        ipd.audit(model, torch.randn(2, 8))
    with pytest.raises(UsageError, match="but an input is on the meta device"):
        ipd.audit(nn.Linear(8, 8), torch.randn(2, 8, device="meta"))


@pytest.mark.parametrize("command", COMMANDS)
def test_an_inference_mode_input_is_the_models_error_not_an_inplace_finding(capsys, factories, command):
    """PyTorch refuses to save an inference tensor for backward: no in-place op is involved."""
    code, out, err = run_cli(capsys, command, f"{FACTORY_MODULE}:inference_input")
    assert code == 3, err
    assert "IPD103" not in out + err
    last = err.splitlines()[-1]
    assert " raised RuntimeError during " in last and "Inference tensors cannot be saved for backward" in last


def test_an_inference_mode_input_in_the_api_is_model_error():
    with torch.inference_mode():
        x = torch.randn(2, 8)
    with pytest.raises(ModelError, match="Inference tensors cannot be saved"):
        ipd.audit(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), x)


def test_an_inplace_write_to_an_inference_view_is_still_ipd103():
    """The rule's own case, through inference mode: a view made there, written with grad on."""

    class M(nn.Module):
        def forward(self, x):
            with torch.inference_mode():
                v = x.view(-1)
            return v.mul_(2)

    x = torch.randn(4, requires_grad=True).clone()
    with pytest.raises(RuntimeError, match="view was created in inference mode"):
        M()(x)  # plain PyTorch
    [finding] = ipd.audit(M(), x).findings
    assert finding.code == "IPD103" and finding.confirmed
    assert "inference_mode" in finding.what and "inference_mode" in finding.fix
