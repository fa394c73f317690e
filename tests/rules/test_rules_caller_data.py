"""IPD106: the model overwrites a tensor its caller passed in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import marker_line
from torch import nn

import inplace_doctor as ipd


def line_of(marker: str) -> int:
    return marker_line(__file__, marker)


def ipd106(findings):
    return [f for f in findings if f.code == "IPD106"]


def test_first_layer_inplace_relu_on_the_input_batch():
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    before = x.clone()
    [f] = ipd106(ipd.audit(model, x).findings)
    assert f.severity is ipd.Severity.WARNING
    assert f.mutation.module == "0" and f.facts.argument == "args[0]"
    assert "model.0.inplace = False" in f.fix
    assert torch.equal(x, before)  # audit gave the caller's batch back
    model(x)
    assert not torch.equal(x, before)  # ... which plain PyTorch does not


class MasksItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x, mask=None):
        x[mask] = 0.0  # <write:mask>
        return self.fc(x)


def test_setitem_on_a_keyword_input_names_the_line_and_argument():
    x = torch.randn(3, 6)
    [f] = ipd106(ipd.audit(MasksItsInput(), x, mask=x > 1).findings)
    assert f.mutation.line == line_of("write:mask") and f.facts.argument == "args[0]"
    assert "clone" in f.fix


def test_watch_treats_arguments_of_the_outermost_call_as_the_callers():
    model = MasksItsInput()
    x = torch.randn(3, 6)
    with ipd.watch(model) as session:
        model(x, x > 1)
        x.mul_(2)  # the caller's own write after the call: not the model's doing
    [f] = ipd106(session.findings)
    assert f.mutation.line == line_of("write:mask")
    assert f.facts.argument == "argument 0 of MasksItsInput"


@pytest.mark.parametrize("named", [True, False], ids=["watch(model)", "watch()"])
def test_watch_treats_keyword_arguments_of_the_outermost_call_as_the_callers_too(named):
    # `model(**batch)`, as Hugging Face's Trainer calls a model: global pre-hooks get no kwargs.
    model = MasksItsInput()
    x = torch.randn(3, 6)
    with ipd.watch(*([model] if named else [])) as session:
        model(x=x, mask=x > 1)
    [f] = ipd106(session.findings)
    assert f.mutation.line == line_of("write:mask")
    assert f.facts.argument == "argument x of MasksItsInput"


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)),  # writes its own activations
        lambda: nn.Sequential(nn.Dropout(0.5, inplace=True), nn.Linear(8, 2)).eval(),  # eval dropout is identity
    ],
    ids=["own-activation", "eval-dropout"],
)
def test_clean_when_the_model_writes_only_its_own_tensors(make):
    assert ipd106(ipd.audit(make(), torch.randn(4, 8)).findings) == []


def test_clean_when_the_model_clones_its_input_first():
    class Clones(nn.Module):
        def forward(self, x):
            x = x.clone()
            x.relu_()
            return x * 2

    assert ipd.audit(Clones(), torch.randn(3, requires_grad=False)).findings == []


def test_ignored_like_any_rule():
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 2))
    assert ipd.audit(model, torch.randn(4, 8), ignore="IPD106").findings == []


# --------------------------------------------------------------------------- IPD107


def _train_step(model, opt):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_state_dict_kept_as_a_snapshot_is_overwritten_by_the_next_step():
    import copy

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ipd.watch(model) as session:
        best = model.state_dict()  # <held:best>
        safe = copy.deepcopy(model.state_dict())
        also_safe = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _train_step(model, opt)
    [f] = [f for f in session.findings if f.code == "IPD107"]
    assert f.count == 4 and f.mutation.api == "SGD.step"
    assert f.facts.handed_out.endswith(f"test_rules_caller_data.py:{line_of('held:best')}")
    assert "model.state_dict()['0.weight']" in f.facts.held or "state_dict()" in f.facts.held
    assert "deepcopy" in f.fix
    assert best and safe and also_safe  # all three were alive during the step


def test_state_dict_saved_or_dropped_is_clean_and_the_patch_is_undone():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    original = nn.Module.state_dict
    with ipd.watch(model) as session:
        len(model.state_dict())
        _train_step(model, opt)
    assert session.findings == []
    assert nn.Module.state_dict is original


def test_ipd107_names_the_model_as_the_user_wrote_it_in_the_message_and_the_fix() -> None:
    """watch(G, D): the alias is `D.state_dict()[...]` (not `model.D...`), and the printed fix
    snapshots `D`, the model the handing-out line called, so it can be pasted there as it stands."""
    G = nn.Linear(2, 2)  # noqa: N806  (the GAN names)
    D = nn.Sequential(nn.Linear(2, 2))  # noqa: N806
    with ipd.watch(G, D) as session:
        best = D.state_dict()
        with torch.no_grad():
            D[0].weight.add_(1.0)
        D.load_state_dict(best)
    (f,) = [f for f in session.findings if f.code == "IPD107" and f.severity is ipd.Severity.WARNING]
    assert "`D.state_dict()['0.weight']`" in f.message and "model.D" not in f.message
    assert "copy.deepcopy(D.state_dict())" in f.fix and "model." not in f.fix
    # load_state_dict copying the untouched bias onto its own memory changes nothing: no finding
    assert not [f for f in session.findings if "0.bias" in f.message]


def test_deepcopy_and_torch_save_are_wrapped_only_while_watching_and_pass_everything_through():
    import copy
    import io

    deepcopy, save = torch.Tensor.__dict__["__deepcopy__"], torch.save
    model = nn.Linear(4, 2)
    with ipd.watch(model):
        assert torch.save is not save and torch.Tensor.__dict__["__deepcopy__"] is not deepcopy
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        kept = copy.deepcopy(model.state_dict())
    assert torch.save is save and torch.Tensor.__dict__["__deepcopy__"] is deepcopy
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert all(torch.equal(loaded[k], v) and torch.equal(kept[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    ("use", "reported"),
    [
        ("cast", False),  # `.to(float64)` on the same device: arithmetic-like, a live view's read
        ("sum", False),
        ("clone", True),
        ("copy_into_another", True),
    ],
)
def test_which_reads_of_a_stale_alias_count_as_a_snapshot(use, reported):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ipd.watch(model) as session:
        best = model.state_dict()
        _train_step(model, opt)
        weight = best["weight"]
        if use == "cast":
            weight.to(torch.float64)
        elif use == "sum":
            weight.sum()
        elif use == "clone":
            weight.clone()
        else:
            torch.empty(2, 4).copy_(weight)
        del weight
    warned = [f for f in session.findings if f.code == "IPD107" and f.severity is ipd.Severity.WARNING]
    assert bool(warned) is reported, [f.message for f in session.findings]
    assert best


def test_a_dict_read_as_a_live_view_is_not_reported_when_copied_later():
    model = nn.Linear(4, 2)
    target = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ipd.watch(model, target) as session:
        source = model.state_dict()
        _train_step(model, opt)
        with torch.no_grad():
            target.weight.mul_(0.5).add_(source["weight"], alpha=0.5)  # arithmetic: a live view
            target.bias.copy_(source["bias"])  # then a copy out of the same dict
    assert [f for f in session.findings if f.code == "IPD107"] == []
    assert source


class ReluFirst(nn.Module):
    def __init__(self, functional: bool) -> None:
        super().__init__()
        self.functional = functional
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(F.relu(x, inplace=True) if self.functional else x.relu_())  # <write:relu-first>


@pytest.mark.parametrize("functional", [True, False], ids=["F.relu(inplace=True)", "relu_"])
def test_watch_waits_for_the_callers_read_only_when_an_inplace_argument_asked_for_the_write(functional):
    x = torch.randn(4, 8)
    with ipd.watch() as session:
        ReluFirst(functional)(torch.randn(4, 8))  # a temporary: no one reads it again
        ReluFirst(functional)(x)
        total = x.sum()  # <read:relu-first>
    found = sorted((f.mutation.line, f.read.line if f.read else None, f.count) for f in ipd106(session.findings))
    write, read = line_of("write:relu-first"), line_of("read:relu-first")
    assert found == ([(write, read, 1)] if functional else [(write, None, 2)])
    assert total is not None
