"""Issue 13, the smaller ones: what `memory` and `optimize` print and write.

- a written inplace.toml never carries a sentinel for a peak that was not measured;
- PyTorch's bookkeeping ops (`_record_function_enter_new`, ...) never name an op in memory output;
- checkpointing is suggested only when it lowers the peak by a meaningful share of it;
- "what would save memory" never lists a module beside its own ancestor or descendant.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.engines.memory.ledger import is_bookkeeping_op
from inplace_doctor.engines.optimize import CHECKPOINT_MIN_SHARE, disjoint_holders

NO_CHECKPOINT_LINE = "no single module holds enough saved activations for checkpointing to lower the peak meaningfully"


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


# -- 1. no sentinel in the written config ---------------------------------------------


def test_a_config_written_when_the_shipped_model_raises_has_no_sentinel_peak(tmp_path: Path, capsys) -> None:
    # sigmoid_then_relu's shipped configuration breaks backward: its peak cannot be measured.
    path = tmp_path / "inplace.toml"
    code = main(["optimize", "inplace_doctor.examples:sigmoid_then_relu", "--no-checkpoint", "--write", str(path)])
    assert code == 0, capsys.readouterr().err
    text = path.read_text()
    header = tomllib.loads(text)["inplace-doctor"]
    assert "peak-shipped-bytes" not in header, text
    assert all(not (isinstance(v, int) and v < 0) for v in header.values()), header
    assert header["peak-planned-bytes"] > 0
    why = [line for line in text.splitlines() if line.startswith("# peak-shipped-bytes:")]
    assert len(why) == 1 and "the shipped configuration raises (" in why[0], text


def test_a_config_written_when_the_shipped_model_runs_carries_its_measured_peak(tmp_path: Path) -> None:
    torch.manual_seed(0)
    plan = ipd.optimize(nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)), torch.randn(4, 8), suggest_checkpoint=False)
    plan.write(tmp_path / "inplace.toml")
    header = tomllib.loads((tmp_path / "inplace.toml").read_text())["inplace-doctor"]
    assert plan.peak_shipped is not None and header["peak-shipped-bytes"] == plan.peak_shipped > 0


# -- 2. no bookkeeping op in memory output --------------------------------------------


class _Profiled(nn.Module):
    """A forward that marks a region for the profiler, as training code often does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.profiler.record_function("hidden"):
            h = torch.tanh(self.fc1(x))
        return self.fc2(h)


@pytest.mark.parametrize("make_opt", [sgd, lambda p: torch.optim.Adam(p, lr=1e-3)], ids=["sgd_momentum", "adam"])
def test_memory_output_names_no_bookkeeping_op(make_opt) -> None:
    # Every optimizer.step() (and zero_grad) opens a profiler record_function: its
    # `_record_function_enter_new` used to name the optimizer phase's peak.
    report = ipd.memory(_Profiled(), torch.randn(16, 32), optimizer=make_opt)
    names = {op for _, _, op, _ in report.timeline} | {p.op for p in report.peaks.values()}
    assert not [n for n in names if n.startswith("_record_function") or is_bookkeeping_op("aten", n)], names
    assert "optimizer" in report.peaks and report.peaks["optimizer"].op  # still named, by a real op
    text = str(report) + str(report.to_dict())
    assert "_record_function" not in text and "profiler" not in text


def test_resnet18_memory_cli_names_a_real_op_at_the_optimizer_peak(capsys) -> None:
    assert main(["memory", "torchvision.models:resnet18", "--input", "2x3x32x32"]) == 0
    out = capsys.readouterr().out
    optimizer_line = next(line for line in out.splitlines() if line.strip().startswith("optimizer"))
    assert "_record_function" not in out, optimizer_line


def test_bookkeeping_ops_are_recognised_by_namespace_and_name() -> None:
    assert is_bookkeeping_op("profiler", "_record_function_enter_new")
    assert is_bookkeeping_op("profiler", "_record_function_exit")
    assert is_bookkeeping_op("aten", "_assert_async")
    assert not is_bookkeeping_op("aten", "mul_") and not is_bookkeeping_op("aten", "_local_scalar_dense")


# -- 3. checkpointing only where it matters -------------------------------------------


def test_checkpointing_is_not_suggested_for_a_negligible_saving_and_says_so_in_one_line() -> None:
    # resnet18 at 2x3x32x32 with momentum: parameters, gradients and momentum are the peak;
    # the best candidate holds well under 1% of it.
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    plan = ipd.optimize(model, torch.randn(2, 3, 32, 32), optimizer=sgd, steps=1)
    assert plan.checkpoint is None
    assert plan.checkpoint_declined is not None and plan.checkpoint_declined.startswith(NO_CHECKPOINT_LINE)
    text = str(plan)
    lines = [line for line in text.splitlines() if "checkpointing" in line]
    assert lines == [f"checkpointing: {plan.checkpoint_declined}"], lines
    assert f"{CHECKPOINT_MIN_SHARE:.0%}" in lines[0] and "layer1" in lines[0]
    assert plan.to_dict()["checkpoint"] is None and plan.to_dict()["checkpoint_declined"] == plan.checkpoint_declined


def test_a_suggested_checkpoint_lowers_the_peak_by_at_least_the_threshold() -> None:
    torch.manual_seed(0)

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.GELU())

    plan = ipd.optimize(nn.Sequential(block(), block(), block(), nn.Linear(64, 1)), torch.randn(2048, 64), optimizer=sgd)
    cp = plan.checkpoint
    assert cp is not None and plan.checkpoint_declined is None, plan.checkpoint_declined
    assert cp.peak_before - cp.peak_after >= CHECKPOINT_MIN_SHARE * cp.peak_before


# -- 4. no parent beside its child -----------------------------------------------------


def test_what_would_save_memory_lists_no_module_beside_its_ancestor() -> None:
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None)
    plan = ipd.optimize(model, torch.randn(2, 3, 64, 64), optimizer=sgd, suggest_checkpoint=False, steps=1)
    lines = str(plan).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("what would save memory"))
    listed = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        listed.append(line.split()[-1])
    assert listed and listed == [name for name, _ in plan.largest_holders(5)]
    for a in listed:
        for b in listed:
            assert a == b or not (b.startswith(a + ".") or a.startswith(b + ".")), (a, b, listed)
    # The full, nested list is still there for whoever needs it (the checkpoint candidate).
    nested = [name for name, _ in plan.saved_by_module[:5]]
    assert any(b.startswith(a + ".") for a in nested for b in nested), nested


def test_disjoint_holders_skips_ancestors_and_descendants_greedily() -> None:
    holders = [("features", 100), ("features.1", 60), ("classifier", 30), ("features.10", 20),
               ("classifier.0", 10), ("head", 5), ("features1", 4)]
    assert disjoint_holders(holders, top=5) == [("features", 100), ("classifier", 30), ("head", 5), ("features1", 4)]
    assert disjoint_holders([("a", 60), ("a.b", 50), ("a.c", 40)], top=2) == [("a", 60)]
    assert disjoint_holders([("a.b", 50), ("a.c", 40), ("a", 30)], top=5) == [("a.b", 50), ("a.c", 40)]


def test_the_shipped_error_in_a_plan_is_never_cut_mid_word():
    import inplace_doctor as ipd
    from inplace_doctor.examples import SigmoidThenReLU

    plan = ipd.optimize(SigmoidThenReLU(), torch.randn(4, 8), suggest_checkpoint=False)
    assert plan.shipped_error is not None and "expected version 0 instead." in plan.shipped_error
    assert plan.shipped_error.endswith(".")  # PyTorch's own message, whole (its hint ends the sentence)
    assert f"({plan.shipped_error})" in plan.toml()


# -- issue 37, item 9: the header says which update ran ----------------------------------


@pytest.mark.parametrize(("make", "said"), [
    (lambda p: torch.optim.SGD(p, lr=0.1), "SGD (no momentum, lr 0.1)"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
     "SGD (momentum 0.9, Nesterov, weight decay 0.0005, lr 0.1)"),
    (lambda p: torch.optim.Adam(p, weight_decay=0.01), "Adam (betas (0.9, 0.999), L2 weight decay 0.01, lr 0.001)"),
    (lambda p: torch.optim.AdamW(p), "AdamW (betas (0.9, 0.999), decoupled weight decay 0.01, lr 0.001)"),
])
def test_the_memory_header_says_the_optimizers_real_settings(make, said) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    report = ipd.memory(model, torch.randn(2, 4), optimizer=make)
    assert str(report).splitlines()[0].endswith(f"train mode, {said}, 2 step(s) on cpu"), str(report)
    assert report.to_dict()["optimizer_settings"][0]["lr"] == float(said.rsplit("lr ", 1)[1].rstrip(")"))


def test_the_optimize_header_says_sgd_with_momentum(capsys) -> None:
    assert main(["optimize", "inplace_doctor.examples:residual_relu", "--no-checkpoint"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("inplace-doctor optimize: inplace_doctor.examples:residual_relu, train mode, "
                             "SGD (momentum 0.9, lr 0.01), inputs "), header
