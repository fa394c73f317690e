"""IPD105: an in-place flag or augmented assignment changes what a later op reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import marker_line
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.causes import SideEffectCause


def line_of(marker: str) -> int:
    return marker_line(__file__, marker)


def ipd105(findings):
    return [f for f in findings if f.code == "IPD105"]


class ResidualModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x)
        return h + self.act(h)  # <residual>


class ResidualFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        out = F.relu(h, inplace=True)  # <functional-write>
        return torch.cat([out, h], dim=1)  # <functional-read>


class AugmentedKeepsAlias(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        kept = h
        h += 1  # <augmented-write>
        return h * kept  # <augmented-read>


def test_residual_with_inplace_relu_module_is_an_error_with_the_measured_difference():
    torch.manual_seed(0)
    model, x = ResidualModule(), torch.randn(3, 4)
    [f] = ipd105(ipd.audit(model, x).findings)
    assert f.severity is ipd.Severity.ERROR
    assert f.mutation.line == f.read.line == line_of("residual")
    assert f.mutation.module == "act" and f.read.op == "aten.add"
    assert "model.act.inplace = False" in f.fix
    h = model.fc(x)
    assert f.facts.max_difference == pytest.approx(float((h.relu() - h).abs().max()))
    assert "read by" in str(ipd.audit(model, x))


def test_functional_inplace_argument_read_by_cat():
    [f] = ipd105(ipd.audit(ResidualFunctional(), torch.randn(3, 4)).findings)
    assert f.mutation.line == line_of("functional-write") and f.read.line == line_of("functional-read")
    assert f.read.op == "aten.cat" and "inplace=False" in f.fix


def test_augmented_assignment_read_through_another_name_is_a_warning():
    [f] = ipd105(ipd.audit(AugmentedKeepsAlias(), torch.randn(3, 4)).findings)
    assert f.severity is ipd.Severity.WARNING
    assert f.mutation.line == line_of("augmented-write") and f.read.line == line_of("augmented-read")
    assert "h = h + 1" in f.fix
    assert f.facts.max_difference == pytest.approx(1.0)


def test_zero_difference_on_this_input_is_said_plainly():
    model = ResidualModule()
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.fill_(1.0)  # h > 0 everywhere: relu changes nothing on this input
    [f] = ipd105(ipd.audit(model, torch.randn(3, 4)).findings)
    assert f.facts.max_difference == 0.0
    assert "difference 0" in f.message and "other inputs will differ" in f.message


def test_detection_changes_no_value_gradient_or_identity():
    torch.manual_seed(0)
    model, x = ResidualModule(), torch.randn(3, 4)
    out = model(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with ipd.watch(model) as session:
        out2 = model(x)
        out2.sum().backward()
    assert torch.equal(out, out2)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    assert [f.code for f in session.findings] == ["IPD105"]


class ChainedInplace(nn.Module):
    """`out += identity; out = relu(out)` (torchvision's Bottleneck), then optionally a residual read."""

    def __init__(self, read_original: bool):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.read_original = read_original

    def forward(self, x):
        h = self.fc(x)
        out = h
        out += x  # <chain-first>
        out = self.act(out)  # <chain-second>
        return out * h if self.read_original else out  # <chain-read>


def _node_names(t):
    seen, todo, names = set(), [t.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        todo.extend(f for f, _ in node.next_functions)
    return names


@pytest.mark.parametrize("read_original", [False, True], ids=["clean", "reads-original"])
def test_an_inplace_call_on_the_alias_of_an_earlier_one_runs_on_what_it_views(read_original):
    """The second in-place call gets the alias the first handed back: it runs on the tensor the
    alias views, as plain PyTorch would, so autograd builds no CopySlices (a full-size copy at
    backward); values, gradients and findings are unchanged."""
    torch.manual_seed(0)
    model, x = ChainedInplace(read_original), torch.randn(3, 4, requires_grad=True)
    out = model(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in [*model.parameters(), x]]
    model.zero_grad()
    x.grad = None
    with ipd.watch(model) as session:
        out2 = model(x)
        names = _node_names(out2)
        out2.sum().backward()
    assert torch.equal(out, out2)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, [*model.parameters(), x]))
    assert "torch::autograd::CopySlices" not in names and "AsStridedBackward0" not in names
    found = ipd105(session.findings)
    if not read_original:
        assert found == []
    else:
        [f] = found  # `h` was overwritten by `+=` (and again by the ReLU) and read after
        assert f.mutation.line == line_of("chain-first") and f.read.line == line_of("chain-read")


class BufferCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.seen += 1  # augmented assignment on a buffer: its identity must survive
        return self.fc(x)


def test_buffers_and_parameters_keep_their_identity():
    model = BufferCounter()
    buffer = model.seen
    with ipd.watch(model):
        model(torch.randn(2, 4))
    assert model.seen is buffer and float(buffer) == 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True), nn.Dropout(0.2, inplace=True)),
    ],
    ids=["sequential", "bn-relu-dropout"],
)
def test_chains_that_only_use_the_result_are_clean(make):
    assert ipd105(ipd.audit(make(), torch.randn(3, 4)).findings) == []


def test_rebinding_augmented_assignment_and_out_of_place_residual_are_clean():
    class Clean(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x
            h = self.fc(x)
            h += identity  # h is rebound; nobody else holds the old h
            return self.act(h) + identity  # identity was never overwritten

    assert ipd.audit(Clean(), torch.randn(3, 4)).findings == []


def test_library_augmented_assignments_are_not_the_users():
    model = nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters())  # adam.py does `step_t += 1` on its state
    with ipd.watch(model) as session:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert session.findings == []


# --------------------------------------------------------------------------- IPD108


class Accumulates(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.total = torch.zeros(())

    def forward(self, x):
        h = self.fc(x)
        self.total.add_(h.detach().sum())  # <accumulate>
        return h


def test_reentrant_checkpoint_repeats_an_inplace_accumulation():
    from torch.utils.checkpoint import checkpoint

    model = Accumulates()
    with ipd.watch(model) as session:
        checkpoint(model, torch.randn(2, 4, requires_grad=True), use_reentrant=True).sum().backward()
    [f] = [f for f in session.findings if f.code == "IPD108"]
    assert f.mutation.line == line_of("accumulate") and f.severity is ipd.Severity.WARNING
    assert f.mutation.phase == "backward"


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_batchnorm_updates_running_stats_again(reentrant):
    from torch.utils.checkpoint import checkpoint

    block = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
    with ipd.watch(block) as session:
        checkpoint(block, torch.randn(2, 3, 8, 8, requires_grad=True), use_reentrant=reentrant).sum().backward()
    kinds = {f.facts.what_changed for f in session.findings if f.code == "IPD108" and f.cause is SideEffectCause.REPEATED}
    assert "BatchNorm running statistics" in kinds
    assert all(f.mutation.module == "1" for f in session.findings if f.code == "IPD108")


def test_no_checkpoint_and_gradient_accumulation_are_not_side_effects():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ipd.watch(model) as session:
        for _ in range(3):
            opt.zero_grad(set_to_none=False)  # grads written in forward, accumulated in backward
            model(torch.randn(2, 3, 8, 8)).sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    assert session.findings == []


def test_forward_hook_feature_extractor_followed_by_an_inplace_relu():
    """Grad-CAM / feature extraction: the stored activation is overwritten by the next ReLU(inplace=True)."""
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None).eval()
    features = {}
    model.bn1.register_forward_hook(lambda module, args, output: features.__setitem__("bn1", output))
    with ipd.watch(model) as session, torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
        smallest = features["bn1"].min()  # <features-read>
    [f] = ipd105(session.findings)
    assert f.mutation.module == "relu" and f.read.line == line_of("features-read")
    assert float(smallest) >= 0.0  # what the hook "kept" was rectified in place
    assert f.facts.max_difference > 0 and "model.relu.inplace = False" in f.fix


def _region(x):
    y = torch.sin(x)
    x.mul_(2)  # <ckpt-input-write>
    return y


@pytest.mark.parametrize("reentrant", [True, False])
def test_inplace_write_to_a_checkpoint_input_raises_like_pytorch_and_is_explained(reentrant):
    from torch.utils.checkpoint import checkpoint

    def run():
        x = torch.randn(3, requires_grad=True) * 1
        checkpoint(_region, x, use_reentrant=reentrant).sum().backward()

    with pytest.raises(RuntimeError):
        run()  # plain PyTorch raises in both modes
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch() as session:
        run()
    [f] = session.findings
    assert f.code == "IPD108" and f.severity is ipd.Severity.ERROR and f.confirmed is True
    assert f.mutation.line == line_of("ckpt-input-write")
    assert raised.value.findings[0].code == "IPD108"


@pytest.mark.parametrize(
    "call",
    [
        lambda x: F.relu(x, inplace=True),
        lambda x: F.relu6(x, inplace=True),
        lambda x: F.hardtanh(x, -0.5, 0.7, inplace=True),
        lambda x: F.leaky_relu(x, 0.2, inplace=True),
        lambda x: x.add_(torch.full_like(x, -0.3), alpha=2.0),
        lambda x: x.sub_(1.5),
    ],
    ids=["relu", "relu6", "hardtanh", "leaky_relu", "add_", "sub_"],
)
def test_change_measured_without_a_copy_equals_the_exact_difference(call):
    """IPD105 measures these ops with a read-only reduction before the write; it must be exact."""
    from inplace_doctor.trace.reads.inplace_calls import largest_change

    torch.manual_seed(0)
    x = torch.randn(64) * 8
    recorded = {}

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "change" not in recorded and (kwargs.get("inplace") or getattr(func, "__name__", "") in ("add_", "sub_")):
                recorded["change"] = largest_change(func, args, kwargs)
            return func(*args, **kwargs)

    original = x.clone()
    with Spy():
        call(x)
    assert recorded["change"] == pytest.approx(float((x - original).abs().max()), rel=1e-6)
