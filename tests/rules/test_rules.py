"""Each rule: fixtures that must be flagged (both lines asserted) and look-alikes that must stay clean.

Lines are found by marker comments in this file (`# <write:name>`, `# <save:name>`),
so editing the file never silently breaks the assertions.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import marker_line
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.causes import Unreached


def line_of(marker: str) -> int:
    return marker_line(__file__, marker)


def only(findings, code):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, [f.message for f in findings]
    return found[0]


def serious(findings):
    return [f for f in findings if f.severity in (ipd.Severity.ERROR, ipd.Severity.WARNING)]


def assert_lines(finding, write: str, save: str | None = None):
    assert finding.mutation.file == __file__
    assert finding.mutation.line == line_of(f"write:{write}"), finding.message
    if save is not None:
        assert finding.saved is not None and finding.saved.file == __file__
        assert finding.saved.line == line_of(f"save:{save}"), finding.message


# --------------------------------------------------------------------------- IPD101


class SigmoidGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        g = torch.sigmoid(self.fc(x))  # <save:gate>
        return self.act(g)  # <write:gate>


def test_ipd101_inplace_relu_after_sigmoid_names_both_lines_and_module_fix():
    report = ipd.audit(SigmoidGate(), torch.randn(3, 6))
    f = only(report.findings, "IPD101")
    assert_lines(f, "gate", "gate")
    assert f.severity is ipd.Severity.ERROR and f.confirmed is True
    assert f.mutation.module == "act" and f.mutation.op == "aten.relu_"
    assert f.slot == "SigmoidBackward0.result"
    assert "model.act.inplace = False" in f.fix
    assert "version 1" in f.message and "version 0" in f.message


class SinResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        h += torch.sin(h)  # <write:sin>
        return h


def test_ipd101_augmented_assignment_when_f_saves_x():
    f = only(ipd.audit(SinResidual(), torch.randn(3, 6)).findings, "IPD101")
    assert f.mutation.line == line_of("write:sin")
    assert f.saved.line == line_of("write:sin")  # sin saved h on the same line
    assert f.slot == "SinBackward0.self"
    assert "h = h + torch.sin(h)" in f.fix


def test_ipd101_linear_input_overwritten_names_addmm_field():
    fc = nn.Linear(4, 4)

    def step(x):
        h = x * 1
        y = fc(h)  # <save:addmm>
        h.mul_(3)  # <write:addmm>
        return y

    with ipd.watch() as session:
        y = step(torch.randn(2, 4))
    f = only(session.findings, "IPD101")
    assert_lines(f, "addmm", "addmm")
    assert f.slot in {"AddmmBackward0.mat1", "MmBackward0.self"}
    assert "h = h * 3" not in f.fix and "mul(" in f.fix
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_ipd101_write_through_a_view_and_setitem():
    with ipd.watch() as session:
        x = torch.randn(4, 3, requires_grad=True)
        e = x.exp()  # <save:view>
        e[:, 0] = 0  # <write:view>
    f = only(session.findings, "IPD101")
    assert_lines(f, "view", "view")
    assert "clone" in f.fix


def test_ipd101_write_under_no_grad_still_breaks_backward():
    with ipd.watch() as session:
        x = torch.randn(5, requires_grad=True)
        t = torch.tanh(x)  # <save:nograd>
        with torch.no_grad():
            t.clamp_(-0.5, 0.5)  # <write:nograd>
    assert_lines(only(session.findings, "IPD101"), "nograd", "nograd")
    with pytest.raises(RuntimeError, match="which is output 0 of Tanh,") as raised:
        t.sum().backward()
    assert type(raised.value) is RuntimeError  # PyTorch's own error, outside the watch


def test_ipd101_forward_hook_that_modifies_the_output():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 1))

    def hook(module, args, output):
        output.mul_(0.5)  # <write:hook>

    model[1].register_forward_hook(hook)
    f = only(ipd.audit(model, torch.randn(2, 4)).findings, "IPD101")
    assert f.mutation.line == line_of("write:hook")
    assert f.saved.module == "1" and f.slot == "SigmoidBackward0.result"
    # Global forward hooks run before a module's own hooks, so the user's hook
    # runs after module "1" has left the module stack: attributed to its parent.
    assert f.mutation.module == ""


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        aux = torch.exp(h)  # <save:branch>
        aux.add_(1)  # <write:branch>
        return h, aux


def test_ipd101_branch_backward_never_reaches_is_unconfirmed_info():
    report = ipd.audit(TwoHeads(), torch.randn(2, 4), loss_fn=lambda out: out[0].sum())
    f = only(report.findings, "IPD101")
    assert_lines(f, "branch", "branch")
    assert f.confirmed is False and f.severity is ipd.Severity.INFO and f.unreached is Unreached.NOT_ON_LOSS_PATH
    assert "Unconfirmed" in f.message
    both = only(ipd.audit(TwoHeads(), torch.randn(2, 4)).findings, "IPD101")
    assert both.confirmed is True and both.severity is ipd.Severity.ERROR


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, w):
        ctx.save_for_backward(a, w)  # <save:custom>
        return a * w

    @staticmethod
    def backward(ctx, grad):
        a, w = ctx.saved_tensors
        return grad * w, (grad * a).sum(0)


def test_ipd101_custom_function_saved_tensors():
    with ipd.watch() as session:
        a = torch.randn(3, 2, requires_grad=True) * 1
        w = torch.randn(2, requires_grad=True)
        out = Scale.apply(a, w)  # <apply:custom>
        a.zero_()  # <write:custom>
    f = only(session.findings, "IPD101")
    assert_lines(f, "custom", "custom")  # the `ctx.save_for_backward` line, below the `apply` call
    assert [fr.line for fr in f.saved.stack][-2:] == [line_of("apply:custom"), line_of("save:custom")]
    assert f.slot == "ScaleBackward.saved_tensors[0]"
    assert f.saved.op == "Scale.apply"
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


class TwoConvBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        x = x * 1
        left = self.a(x)  # <save:conv>
        x.relu_()  # <write:conv>
        return left + self.b(x)


def test_ipd101_relu_on_input_that_a_conv_saved():
    f = only(ipd.audit(TwoConvBranches(), torch.randn(1, 3, 8, 8)).findings, "IPD101")
    assert_lines(f, "conv", "conv")
    assert f.slot == "ConvolutionBackward0.input"
    assert f.mutation.op == "aten.relu_"


def test_ipd101_optimizer_step_before_backward_of_a_graph_that_saved_the_weights():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))  # model.2 saves its weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch(model) as session:
        model(x).sum().backward()
        second = model(x).sum()  # <save:opt>
        opt.step()  # <write:opt>
        second.backward()
    f = only(session.findings, "IPD101")
    assert_lines(f, "opt", "opt")
    assert f.saved.module == "2" and f.slot == "AddmmBackward0.mat2"
    assert f.mutation.api == "SGD.step"
    assert "SGD.step" in f.fix
    assert raised.value.findings[0].code == "IPD101"
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_ipd101_retained_graph_overwritten_after_backward_reports_only_when_backward_reruns():
    with ipd.watch() as session:
        x = torch.randn(3, requires_grad=True)
        y = torch.sigmoid(x)  # <save:retain>
        y.sum().backward(retain_graph=True)
        with torch.no_grad():
            y.mul_(2)  # <write:retain>
    # The graph's one backward already ran: the write is a prediction that nothing confirmed.
    assert [(f.code, f.severity) for f in session.findings] == [("IPD101", ipd.Severity.INFO)]
    with pytest.raises(ipd.InplaceError), ipd.watch() as session:
        y.sum().backward()
    f = only(session.findings, "IPD101")
    assert_lines(f, "retain", "retain")
    assert f.confirmed is True


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3), nn.ReLU(inplace=True), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.ReLU(inplace=True), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3, inplace=True), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(inplace=True), nn.Linear(4, 2)),
    ],
    ids=["linear", "batchnorm", "dropout", "gelu", "dropout-inplace", "leaky"],
)
def test_ipd101_clean_inplace_activations_after_ops_that_do_not_save_their_output(make):
    torch.manual_seed(0)
    assert serious(ipd.audit(make(), torch.randn(3, 4)).findings) == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.ReLU(inplace=True)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(inplace=True), nn.Hardtanh(inplace=True)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.ReLU6(inplace=True)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Softmax(-1), nn.Dropout(0.5, inplace=True)),
    ],
    ids=["relu-then-relu_", "leaky_-then-hardtanh_", "tanh-relu6_", "softmax-dropout_"],
)
def test_ipd101_inplace_activation_after_an_op_that_saved_its_output(make):
    """These look harmless but plain PyTorch raises: the first op saved its output."""
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        make()(torch.randn(3, 4)).sum().backward()
    torch.manual_seed(0)
    f = only(ipd.audit(make(), torch.randn(3, 4)).findings, "IPD101")
    assert f.confirmed is True and f.mutation.module in {"2"}


def test_ipd101_clean_residual_adds_when_f_saves_nothing():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            h += h * 2
            h += x
            h.add_(1)
            return h

    assert ipd.audit(Block(), torch.randn(2, 4)).findings == []


def test_ipd101_clean_batchnorm_module_called_twice_in_one_forward():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(self.bn(x).relu_())

    assert ipd.audit(Twice(), torch.randn(5, 4)).findings == []


def test_module_called_twice_gets_a_call_index():
    class Reuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            a = self.act(x * 1)
            return self.act(torch.sigmoid(a))

    x = torch.randn(3, requires_grad=True)
    f = only(ipd.audit(Reuse(), x).findings, "IPD101")
    assert f.mutation.module == "act" and f.mutation.module_call == 2
    assert "call 2" in str(ipd.audit(Reuse(), x))


# --------------------------------------------------------------------------- IPD102


def test_ipd102_leaf_that_requires_grad():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch() as session:
        w.add_(1)  # <write:leaf>
    f = only(session.findings, "IPD102")
    assert f.mutation.line == line_of("write:leaf")
    assert "torch.no_grad()" in f.fix
    assert "leaf Variable" in str(raised.value.__cause__)


def test_ipd102_view_of_a_leaf_and_audit_reports_instead_of_raising():
    class Bad(nn.Module):
        def forward(self, x):
            x[0].mul_(2)  # <write:leafview>
            return x * 1

    report = ipd.audit(Bad(), torch.randn(3, requires_grad=True))
    f = only(report.findings, "IPD102")
    assert f.mutation.line == line_of("write:leafview")
    assert "a view of a leaf tensor" in f.message


def test_ipd102_clean_under_no_grad():
    w = torch.randn(3, requires_grad=True)
    with ipd.watch() as session, torch.no_grad():
        w.add_(1)
    assert session.findings == []


# --------------------------------------------------------------------------- IPD103


def _raise_in_watch(fn):
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch() as session:
        fn()
    return only(session.findings, "IPD103"), raised.value


def test_ipd103_expanded_tensor():
    def fn():
        b = torch.randn(1, 3).expand(4, 3)
        b.add_(1)  # <write:expand>

    f, err = _raise_in_watch(fn)
    assert f.mutation.line == line_of("write:expand") and f.mutation.op == "aten.add_"
    assert "clone()" in f.fix
    assert "single memory location" in str(err.__cause__)


def test_ipd103_unbind_output():
    def fn():
        a, _ = (torch.randn(2, 3, requires_grad=True) * 1).unbind(0)
        a.mul_(2)  # <write:unbind>

    f, _ = _raise_in_watch(fn)
    assert f.mutation.line == line_of("write:unbind") and "unbind" in f.message


def test_ipd103_view_created_under_no_grad():
    def fn():
        t = torch.randn(3, 2, requires_grad=True) * 1
        with torch.no_grad():
            v = t[0]
        v.mul_(2)  # <write:nogradview>

    f, _ = _raise_in_watch(fn)
    assert f.mutation.line == line_of("write:nogradview") and "no_grad" in f.message


def test_ipd103_full_backward_hook_on_resnet_names_the_inplace_relu():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    model.bn1.register_full_backward_hook(lambda *a: None)  # as Grad-CAM-style tools do
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(RuntimeError, match="BackwardHookFunction"):
        model(x)
    report = ipd.audit(model, x)
    f = only(report.findings, "IPD103")
    assert f.mutation.module == "relu"  # the in-place ReLU right after the hooked bn1
    assert "model.relu.inplace = False" in f.fix
    assert f.mutation.file.endswith("torchvision/models/resnet.py")


# --------------------------------------------------------------------------- IPD104


class DataWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        s = torch.sigmoid(self.fc(x))  # <save:data>
        s.data.mul_(0.5)  # <write:data>
        return s


def test_ipd104_write_through_data_is_silent_in_pytorch_and_flagged_here():
    torch.manual_seed(0)
    model, x = DataWrite(), torch.randn(2, 4)
    model(x).sum().backward()  # plain PyTorch: no error at all
    report = ipd.audit(model, x)
    f = only(report.findings, "IPD104")
    assert_lines(f, "data", "data")
    assert "through `.data`" in f.message and f.severity is ipd.Severity.ERROR


def test_ipd104_alias_made_with_set_():
    with ipd.watch() as session:
        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)  # <save:set>
        alias = torch.empty(0)
        alias.set_(s.detach().untyped_storage(), 0, s.shape)
        alias.fill_(0)  # <write:set>
    f = only(session.findings, "IPD104")
    assert_lines(f, "set", "set")


def test_ipd104_numpy_twin_written_with_a_torch_op():
    with ipd.watch() as session:
        base = np.ones(4, dtype=np.float32)
        x = torch.from_numpy(base).requires_grad_()
        s = x.exp()  # <save:numpy>
        twin = torch.from_numpy(s.detach().numpy())
        twin.zero_()  # <write:numpy>
    f = only(session.findings, "IPD104")
    assert_lines(f, "numpy", "numpy")


def test_ipd104_clean_when_write_does_not_touch_saved_bytes():
    with ipd.watch() as session:
        x = torch.randn(8, requires_grad=True)
        big = x * 1
        s = torch.sigmoid(big[:4])
        big.data[4:].zero_()
    assert [f for f in session.findings if f.code == "IPD104"] == []
    s.sum().backward()


# --------------------------------------------------------------------------- cross-cutting


BROKEN = {
    "sigmoid-relu_": lambda: torch.sigmoid(torch.randn(3, requires_grad=True)).relu_().sum().backward(),
    "sin-residual": lambda: _sin_residual(),
    "leaf": lambda: torch.randn(3, requires_grad=True).add_(1),
    "expand": lambda: (torch.randn(1, 3, requires_grad=True) * 1).expand(2, 3).mul_(2),
    "split": lambda: (torch.randn(4, requires_grad=True) * 1).split(2)[0].mul_(2),
    "softmax-dropout_": lambda: torch.nn.functional.dropout(
        torch.randn(2, 3, requires_grad=True).softmax(-1), 0.5, True, inplace=True
    ).sum().backward(),
}


def _sin_residual():
    h = torch.randn(3, requires_grad=True) * 1
    h += torch.sin(h)
    h.sum().backward()


@pytest.mark.parametrize("name", list(BROKEN))
def test_pytorch_error_is_never_lost_inside_watch(name):
    with pytest.raises(RuntimeError):
        BROKEN[name]()
    with pytest.raises(RuntimeError) as raised, ipd.watch():
        BROKEN[name]()
    assert isinstance(raised.value, ipd.InplaceError)
    assert raised.value.findings


def test_pytorch_error_survives_when_its_rule_is_ignored():
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), ipd.watch(ignore="IPD101"):
        BROKEN["sigmoid-relu_"]()
    report = ipd.audit(SigmoidGate(), torch.randn(3, 6), ignore=["IPD101"])
    assert report.findings == [] and any("not selected" in n for n in report.notes)


def test_fail_fast_raises_at_backward_with_the_overwriting_line_chained():
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch(fail_fast=True):
        x = torch.randn(3, requires_grad=True)
        y = x.exp()
        y.add_(1)  # <write:failfast>
        y.sum().backward()  # <backward:failfast>
        raise AssertionError("fail_fast should have raised before this line")
    frames = [tb for tb in _traceback_lines(raised.value.__traceback__) if tb[0] == __file__]
    assert frames[-1][1] == line_of("backward:failfast")
    written = raised.value.__cause__.__cause__
    assert isinstance(written, ipd.WrittenHere)
    assert f'File "{__file__}", line {line_of("write:failfast")}' in str(written)


def test_fail_fast_does_not_stop_a_graph_that_is_never_backpropagated():
    with ipd.watch(fail_fast=True) as session:
        x = torch.randn(3, requires_grad=True)
        y = x.exp()
        y.add_(1)  # the graph through exp is dropped below, never backpropagated
        del y
    assert session.findings == [] and session.report().stats["predictions_dropped"] == 1


def _traceback_lines(tb):
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return out


def test_select_and_ignore_by_prefix():
    model, x = DataWrite(), torch.randn(2, 4)
    assert ipd.audit(model, x, select="IPD1").codes == ["IPD104"]
    assert ipd.audit(model, x, ignore=["IPD104"]).codes == []
    with pytest.raises(ipd.UsageError, match="did you mean IPD104"):
        ipd.audit(model, x, select="IPD14")


def test_refuses_scripted_models_and_audits_compiled_ones_eagerly():
    with pytest.raises(ipd.UsageError, match="TorchScript"):
        ipd.audit(torch.jit.script(nn.Linear(2, 2)), torch.randn(1, 2))
    report = ipd.audit(torch.compile(nn.Linear(2, 2)), torch.randn(1, 2))
    assert report.codes == [] and report.stats["compiled_calls_run_eagerly"] == 1


def test_report_text_and_dict():
    report = ipd.audit(SigmoidGate(), torch.randn(3, 6))
    text = str(report)
    assert "IPD101" in text and f"test_rules.py:{line_of('write:gate')}" in text
    assert re.search(r"1 finding: 1 error", text)
    data = report.to_dict()
    assert data["schema_version"] == 3
    assert data["findings"][0]["mutation"]["line"] == line_of("write:gate")
    assert data["findings"][0]["saved"]["line"] == line_of("save:gate")


def test_every_rule_documents_what_why_example_and_fix():
    for code, rule in ipd.RULES.items():
        assert re.fullmatch(r"IPD\d{3}", code)
        for part in ("What:", "Why:", "Example::", "Fix:"):
            assert part in rule.doc, (code, part)


def test_inputs_that_alias_each_other_still_alias_inside_audit():
    """audit hands the model private copies of non-leaf inputs; views of one tensor stay views of one copy."""

    class WritesSecondInput(nn.Module):
        def forward(self, a, b):
            y = a * a
            b.mul_(2)  # b is a view of a: overwrites what `a * a` saved
            return y

    a = nn.Linear(4, 4)(torch.randn(3, 4))
    b = a[0]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _plain_alias_case()  # plain PyTorch raises for the same program
    report = ipd.audit(WritesSecondInput(), a, b)
    assert report.codes == ["IPD101", "IPD106"]  # b is also the caller's own tensor
    assert type(a.grad_fn).__name__ == "AddmmBackward0"  # the caller's tensor keeps its history


def _plain_alias_case():
    a = nn.Linear(4, 4)(torch.randn(3, 4))
    b = a[0]
    y = a * a
    b.mul_(2)
    y.sum().backward()


class ExpThenMul(nn.Module):
    """The mul saves its input right after exp saved its result, with no op in
    between: a kernel saves its inputs before it dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.cos()
        a = torch.exp(self.w)  # <exp-saves>
        b = y * self.w  # <mul-saves>
        y.add_(1)  # <y-overwritten>
        return a.sum() + b.sum()


def test_an_input_save_right_after_another_ops_output_save_is_attributed_to_its_own_line() -> None:
    finding = next(f for f in ipd.audit(ExpThenMul(), torch.randn(3, 4)).findings if f.code == "IPD101")
    assert finding.saved is not None and finding.saved.line == line_of("mul-saves")
    assert finding.saved.op.startswith("aten.mul") or "mul" in finding.saved.op
    assert finding.mutation.line == line_of("y-overwritten")
