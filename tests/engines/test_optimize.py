"""optimize: decisions from evidence, a config verify accepts, apply_config's checks."""

from __future__ import annotations

import copy
import re
import tomllib
import warnings

import pytest
import torch
import torchvision
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.examples import ResidualReLU, SigmoidThenReLU


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


class Mixed(nn.Module):
    """Three flagged sites: one breaks backward, one corrupts a residual, one is safe;
    and one ReLU that ships out-of-place and could safely run in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 16)
        self.after_sigmoid = nn.ReLU(inplace=True)  # sigmoid saved its result: IPD101
        self.residual = nn.ReLU(inplace=True)  # h is read again by the add: IPD105
        self.plain = nn.ReLU(inplace=True)  # after a Linear: safe
        self.off = nn.ReLU(inplace=False)  # safe, ships off
        self.unused = nn.ReLU(inplace=True)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.after_sigmoid(torch.sigmoid(self.fc1(x)))
        h = self.fc2(a)
        h = h + self.residual(h)
        return self.off(self.fc3(self.plain(h)))


@pytest.fixture(scope="module")
def mixed_plan() -> ipd.Plan:
    torch.manual_seed(0)
    return ipd.optimize(Mixed(), torch.randn(8, 16), optimizer=sgd, suggest_checkpoint=False)


def test_unsafe_sites_are_turned_off_with_their_evidence(mixed_plan: ipd.Plan) -> None:
    d = {x.site: x for x in mixed_plan.decisions}
    assert d["after_sigmoid"].inplace is False and d["after_sigmoid"].safe is False
    assert "IPD101" in d["after_sigmoid"].reason
    assert d["residual"].inplace is False and "IPD105" in d["residual"].reason
    assert d["plain"].inplace is True and d["plain"].safe is True
    assert d["unused"].safe is None and d["unused"].inplace is True  # left as shipped, no evidence
    assert mixed_plan.never_executed == ["unused"]


def test_a_safe_site_that_saves_nothing_is_left_off_and_says_so(mixed_plan: ipd.Plan) -> None:
    off = next(x for x in mixed_plan.decisions if x.site == "off")
    assert off.safe is True and off.inplace is False
    assert off.saves_bytes == 0 and "saves 0 bytes" in off.reason


def test_the_plan_verifies_and_the_shipped_model_is_untouched(mixed_plan: ipd.Plan) -> None:
    assert bool(mixed_plan.verified)
    torch.manual_seed(0)
    model = Mixed()
    original = {n: m.inplace for n, m in model.named_modules() if hasattr(m, "inplace")}
    changed = mixed_plan.apply(model)
    assert changed == {"after_sigmoid": False, "residual": False}
    assert bool(ipd.verify(model, torch.randn(8, 16), optimizer=sgd, steps=2))
    assert original["after_sigmoid"] is True  # the dict was taken before apply


def test_the_config_round_trips_and_records_what_it_was_derived_from(mixed_plan: ipd.Plan, tmp_path) -> None:
    path = tmp_path / "inplace.toml"
    mixed_plan.write(path)
    data = tomllib.loads(path.read_text())
    header = data["inplace-doctor"]
    assert header["inputs"] == ["8x16:float32"] and header["mode"] == "train"
    assert header["never-executed"] == ["unused"]
    assert data["inplace"]["after_sigmoid"] is False and data["inplace"]["plain"] is True
    model = Mixed()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        changed = ipd.apply_config(model, path)
    assert changed == {"after_sigmoid": False, "residual": False}


def test_apply_config_refuses_a_pattern_that_matches_nothing_before_changing_anything(tmp_path) -> None:
    model = Mixed()
    with pytest.raises(ipd.UsageError, match=r"'residul' matches no module of Mixed; did you mean 'residual'\?"):
        ipd.apply_config(model, {"plain": False, "residul": False})
    assert model.plain.inplace is True
    with pytest.raises(ipd.UsageError, match="only modules without an `inplace` option"):
        ipd.apply_config(model, {"fc*": True})
    bad = tmp_path / "bad.toml"
    bad.write_text('[inplace]\n"plain" = "yes"\n')
    with pytest.raises(ipd.UsageError, match="must be true or false"):
        ipd.apply_config(model, bad)
    bad.write_text('[inplace-docter]\n')
    with pytest.raises(ipd.UsageError, match=r"did you mean \[inplace-doctor\]"):
        ipd.apply_config(model, bad)


def test_apply_config_warns_about_modules_the_traced_run_never_executed(mixed_plan: ipd.Plan, tmp_path) -> None:
    path = tmp_path / "inplace.toml"
    path.write_text(mixed_plan.toml() + '"unused" = false\n')
    with pytest.warns(UserWarning, match="never executed.*unused"):
        ipd.apply_config(Mixed(), path)


def test_glob_patterns_cover_repeated_blocks() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    plan = ipd.optimize(model, torch.randn(2, 3, 32, 32), optimizer=sgd, suggest_checkpoint=False)
    text = plan.toml()
    assert '"layer*.*.relu" = true' in text
    assert all(d.safe for d in plan.decisions)
    # conv-BN-ReLU: the in-place ReLUs save nothing at the peak, measured.
    assert all(d.saves_bytes == 0 for d in plan.decisions)
    assert plan.peak_planned == plan.peak_shipped and bool(plan.verified)
    clone = torchvision.models.resnet18(weights=None)
    for m in clone.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    assert ipd.apply_config(clone, tomllib.loads(text)["inplace"]) == {
        n: True for n, m in clone.named_modules() if isinstance(m, nn.ReLU)
    }


@pytest.mark.parametrize("factory", [SigmoidThenReLU, ResidualReLU])
def test_examples_that_need_a_flag_off_get_a_config_verify_accepts(factory) -> None:
    torch.manual_seed(0)
    model, x = factory(), torch.randn(4, 8)
    plan = ipd.optimize(model, x, optimizer=sgd, suggest_checkpoint=False)
    assert [d.site for d in plan.decisions if d.changed] == ["act"]
    fixed = copy.deepcopy(model)
    plan.apply(fixed)
    assert bool(ipd.verify(fixed, x, optimizer=sgd, steps=2))
    assert model.act.inplace is True


class WantsInplace(nn.Module):
    """A big out-of-place activation whose in-place form lowers the forward peak."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 4096)
        self.act = nn.Hardtanh(inplace=False)
        self.fc2 = nn.Linear(4096, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.fc(x)
        return self.fc2(self.act(h))


def test_a_safe_site_that_lowers_the_peak_is_turned_on_with_its_measured_saving() -> None:
    torch.manual_seed(0)
    plan = ipd.optimize(WantsInplace(), torch.randn(256, 64), suggest_checkpoint=False)
    act = next(d for d in plan.decisions if d.site == "act")
    assert act.safe and act.inplace and act.saves_bytes and act.saves_bytes > 0
    assert plan.peak_shipped is not None and plan.peak_shipped - plan.peak_planned == act.saves_bytes
    assert bool(plan.verified)


def test_checkpoint_suggestion_is_measured() -> None:
    torch.manual_seed(0)
    def block(width: int) -> nn.Module:
        return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, 64), nn.GELU())

    # Activations dominate (a large batch through narrow layers), spread over three blocks:
    # the candidate is the largest holder with at most half of them, one whole block.
    model = nn.Sequential(block(256), block(256), block(256), nn.Linear(64, 1))
    plan = ipd.optimize(model, torch.randn(2048, 64), optimizer=sgd)
    cp = plan.checkpoint
    assert cp is not None and cp.module in ("0", "1", "2")
    assert cp.saved_bytes == dict(plan.saved_by_module)[cp.module]
    assert cp.peak_after < cp.peak_before and cp.time_ratio > 0
    assert f"checkpointing {cp.module} (measured)" in str(plan)


ZOO = ["resnet18", "mobilenet_v3_small", "squeezenet1_0", "shufflenet_v2_x0_5", "mnasnet0_5", "efficientnet_b0"]


@pytest.mark.parametrize("name", ZOO)
def test_optimize_on_the_torchvision_zoo_gives_a_config_verify_accepts(name: str) -> None:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    x = torch.randn(2, 3, 64, 64)
    plan = ipd.optimize(model, x, optimizer=sgd, suggest_checkpoint=False, steps=1)
    assert bool(plan.verified), str(plan.verified)
    configured = copy.deepcopy(model)
    plan.apply(configured)
    assert bool(ipd.verify(configured, x, optimizer=sgd, steps=2))


def test_cli_optimize_writes_a_config_that_apply_config_reads(tmp_path, capsys) -> None:
    import json

    from inplace_doctor.cli.main import main

    path = tmp_path / "inplace.toml"
    assert main(["optimize", "inplace_doctor.examples:residual_relu", "--write", str(path), "--no-checkpoint"]) == 0
    out = capsys.readouterr().out
    assert "* act  on  -> off  unsafe: IPD105" in out and f"wrote {path}" in out
    model, _ = __import__("inplace_doctor.examples", fromlist=["residual_relu"]).residual_relu()
    assert ipd.apply_config(model, path) == {"act": False}
    assert main(["optimize", "inplace_doctor.examples:residual_relu", "--format", "json", "--no-checkpoint"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decisions"][0]["site"] == "act" and data["decisions"][0]["inplace"] is False
    assert data["verified"] is True
    assert main(["optimize", "inplace_doctor.examples:residual_relu", "--optimizer", "adma"]) == 2
    assert "did you mean 'adam'" in capsys.readouterr().err


class _VggLike(nn.Module):
    """Conv, ReLU(inplace=True), MaxPool with no blocks: the largest holder under half of the saved
    activations is an in-place ReLU, which cannot be checkpointed (its recompute writes the saved input)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Linear(8 * 4 * 4, 64), nn.ReLU(True), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def test_the_checkpointing_suggestion_never_wraps_a_module_that_runs_in_place() -> None:
    torch.manual_seed(0)
    model = _VggLike()
    plan = ipd.optimize(model, torch.randn(64, 3, 16, 16), optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    # Measured, whether or not it lowers the peak enough to be suggested (see test_small_memory_output.py).
    if plan.checkpoint is not None:
        candidate = plan.checkpoint.module
    else:
        assert plan.checkpoint_declined is not None, plan.notes
        match = re.search(r"measured: checkpointing (\S+),", plan.checkpoint_declined)
        assert match, plan.checkpoint_declined
        candidate = match.group(1)
    assert candidate == "features.2"  # features.1 holds more, but is a ReLU(inplace=True)
    assert not getattr(model.get_submodule(candidate), "inplace", False)
    assert not any("could not be measured" in n for n in plan.notes)


class _WithUnusedBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.aux = nn.ReLU(inplace=True)  # never called: not in the plan's flags

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def test_a_plan_that_changes_no_flag_times_one_configuration_even_with_unexecuted_modules() -> None:
    plan = ipd.optimize(_WithUnusedBranch(), torch.randn(4, 8), suggest_checkpoint=False)
    assert not any(d.changed for d in plan.decisions)
    assert plan.time_shipped == plan.time_planned  # one measurement, not two that happen to differ
    assert "one configuration, timed once" in str(plan)


class _CheckpointsOneBlock(nn.Module):
    """Three blocks; `checkpointed` names the one whose forward runs under `torch.utils.checkpoint`."""

    def __init__(self, checkpointed: str | None = None) -> None:
        super().__init__()
        def block(width: int) -> nn.Module:
            return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, 64), nn.GELU())

        self.a, self.b, self.c = block(256), block(512), block(256)
        self.head = nn.Linear(64, 1)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in "abc":
            block = getattr(self, name)
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if name == self.checkpointed else block(x)
        return self.head(x)


def test_the_checkpointing_suggestion_measures_what_checkpointing_that_module_by_hand_measures() -> None:
    # The suggestion once measured a deep copy whose wrapped forward still ran the original
    # copy's module: that module's gradients landed outside the measured model and its
    # momentum was never created, so the reported peak was off by both.
    torch.manual_seed(0)
    model = _CheckpointsOneBlock()
    x = torch.randn(1024, 64)
    plan = ipd.optimize(model, x, optimizer=sgd)
    assert plan.checkpoint is not None and plan.checkpoint.module in ("a", "b", "c")
    by_hand = _CheckpointsOneBlock(checkpointed=plan.checkpoint.module)
    by_hand.load_state_dict(model.state_dict())
    assert plan.checkpoint.peak_after == ipd.memory(by_hand, x, optimizer=sgd).peak


def test_an_optimizer_instance_is_measured_with_its_state_like_a_factory() -> None:
    # Each configuration is copied together with the optimizer: a copy of the optimizer
    # alone would step copies of the original parameters (no gradients: no momentum).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(inplace=True), nn.Linear(256, 10))
    x = torch.randn(8, 256)
    instance = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with_instance = ipd.optimize(model, x, optimizer=instance, suggest_checkpoint=False)
    with_factory = ipd.optimize(model, x, optimizer=sgd, suggest_checkpoint=False)
    assert with_instance.peak_planned == with_factory.peak_planned == ipd.memory(model, x, optimizer=instance).peak
    assert not instance.state  # the user's optimizer never stepped
