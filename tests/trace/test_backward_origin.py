"""Errors raised inside backward name the forward line that created the failing node (what
anomaly mode's second traceback shows, without anomaly mode), for every kind of error.

Built from public reports: xu-ji/IIC#27 and linjieli222/VQA_ReGAT#39 (backward raises
"more than one element of the written-to tensor refers to a single memory location" after
`p_j[mask] = EPS` on an `expand()`ed tensor; the fix was a `.clone()` after `expand`)."""

from __future__ import annotations

import pytest
import torch
from conftest import line_of
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.errors import InplaceError, ModelError

SOURCE = __file__


class IICLoss(nn.Module):
    """IIC's mutual-information loss as its authors wrote it (before the fix)."""

    def forward(self, x):
        p = x.softmax(1)
        k = p.shape[1]
        p_j = p.sum(dim=0).view(1, k).expand(k, k)
        p_j[(p_j < 0.4).data] = 1e-3  # <expanded write>
        return p_j.log().sum()


class IICLossFixed(nn.Module):
    def forward(self, x):
        p = x.softmax(1)
        k = p.shape[1]
        p_j = p.sum(dim=0).view(1, k).expand(k, k).clone()
        p_j[(p_j < 0.4).data] = 1e-3
        return p_j.log().sum()


class WrongShapeGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad[:1]


class RaisingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("custom backward failed on purpose")


class UsesFunction(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn.apply(self.fc(x))  # <custom apply>


def iic_input():
    torch.manual_seed(0)
    return torch.randn(3, 3, requires_grad=True)


def test_plain_pytorch_raises_in_backward_naming_no_line():
    loss = IICLoss()(iic_input())
    with pytest.raises(RuntimeError, match="refers to a single memory location"):
        loss.backward()


def test_the_overlap_error_raised_in_backward_names_the_forward_write_under_watch():
    with pytest.raises(InplaceError) as info, ipd.watch():
        IICLoss()(iic_input()).backward()  # <backward call>
    [finding] = info.value.findings
    assert finding.code == "IPD103"
    assert finding.mutation.line == line_of(SOURCE, "# <expanded write>")
    assert finding.mutation.op == "aten.index_put_"
    assert "inside backward" in finding.what and "CopySlices" in finding.what
    assert f":{line_of(SOURCE, '# <backward call>')}" in finding.what  # where backward was called, too


def test_the_overlap_error_raised_in_backward_names_the_forward_write_in_audit():
    [finding] = ipd.audit(IICLoss(), iic_input()).findings
    assert finding.code == "IPD103" and finding.confirmed
    assert finding.mutation.line == line_of(SOURCE, "# <expanded write>")
    assert "`.clone()`" in finding.fix


def test_the_fixed_iic_loss_is_clean():
    assert ipd.audit(IICLossFixed(), iic_input()).findings == []


@pytest.mark.parametrize(
    ("fn", "error", "words"),
    [
        (WrongShapeGrad, RuntimeError, "WrongShapeGradBackward returned a wrong gradient for input 0"),
        (RaisingBackward, ValueError, "custom backward failed on purpose"),
    ],
)
def test_a_custom_backward_error_gets_a_note_naming_the_apply_line_under_watch(fn, error, words):
    model = UsesFunction(fn)
    with pytest.raises(error) as info, ipd.watch(model):  # the user's own exception, unchanged in type
        model(torch.randn(3, 4)).sum().backward()
    [note] = info.value.__notes__
    assert note.startswith(f"inplace-doctor: raised inside backward, in {fn.__name__}Backward, the backward of ")
    assert f"`{fn.__name__}.apply` in model (UsesFunction) at " in note
    assert f":{line_of(SOURCE, '# <custom apply>')}" in note
    assert words in note


@pytest.mark.parametrize("fn", [WrongShapeGrad, RaisingBackward])
def test_a_custom_backward_error_in_audit_names_the_apply_line(fn):
    with pytest.raises(ModelError) as info:
        ipd.audit(UsesFunction(fn), torch.randn(3, 4))
    message = str(info.value)
    assert "during backward: raised inside backward" in message
    assert f":{line_of(SOURCE, '# <custom apply>')}" in message


def test_an_error_raised_in_forward_gets_no_backward_note():
    class Bad(nn.Module):
        def forward(self, x):
            raise ValueError("forward failed")

    with pytest.raises(ValueError) as info, ipd.watch():
        Bad()(torch.randn(2))
    assert not getattr(info.value, "__notes__", None)


def test_outputs_and_gradients_are_bit_identical_with_the_origins_recorded():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(5, 4)
    out = model(x)
    out.sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with ipd.watch(model):
        watched = model(x)
        watched.sum().backward()
    assert torch.equal(out, watched)
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters()))


def test_the_cli_names_the_apply_line_for_a_custom_backward_error(capsys, factory_module):
    source = '''
import torch
from torch import nn


class Raises(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("custom backward failed on purpose")


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return Raises.apply(self.fc(x))


def model():
    return M(), torch.randn(2, 4)
'''
    factory_module("ipd_backward_origin_factories", source)
    code = main(["audit", "ipd_backward_origin_factories:model"])
    err = capsys.readouterr().err
    assert code == 3
    last = err.splitlines()[-1]
    assert "in RaisesBackward, the backward of `Raises.apply` in model (M) at " in last
    assert f"ipd_backward_origin_factories.py:{line_of(source, 'Raises.apply(self.fc(x))')}" in last


def test_run_prints_the_note_after_the_scripts_traceback_and_blames_the_script(capsys, tmp_path):
    """Autograd's engine raising below the tool's wrappers of `backward()` is the script's error
    (exit 1, as python), never the tool's crash (exit 4)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "\n"
        "class WrongShape(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x * 2\n"
        "\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad):\n"
        "        return grad[:1]\n"
        "\n"
        "w = torch.nn.Linear(4, 4)\n"
        "y = WrongShape.apply(w(torch.randn(3, 4)))\n"
        "y.sum().backward()\n",
        encoding="utf-8",
    )
    code = main(["run", str(script)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "inplace-doctor failed" not in err
    assert 'File "' in err and "line 14, in <module>" in err  # the script's own traceback
    assert "in WrongShapeBackward, the backward of `WrongShape.apply` at " in err and "train.py:13: " in err
    assert "WrongShapeBackward returned a wrong gradient for input 0" in err
