"""Every fix template the tool prints, applied to its example program exactly as printed.

Each case is a small training program written to a file. It runs under `watch()`
(or `audit`), the printed fix is parsed and applied to the file as an edit (the
line and the text the fix names, nothing else), and the edited program is run
again, plain. It must then run, raise nothing, and compute what the intended
program (written by hand, out of place) computes: the same outputs, losses,
gradients and parameters, bit for bit. Fixes that offer a choice are applied
both ways, and the one that changes something must say what.
"""

from __future__ import annotations

import re
import runpy
import textwrap
from pathlib import Path

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Severity

REPLACE = re.compile(r"replace `(?P<old>.+?)` with `(?P<new>.+?)` at (?P<file>[^\s:`]+):(?P<line>\d+)")
INSERT = re.compile(r"insert `(?P<new>.+?)` before `(?P<old>.+?)` at (?P<file>[^\s:`]+):(?P<line>\d+)")
CONSTRUCT = re.compile(r"construct `(?P<ref>.+?)` with inplace=False at (?P<file>[^\s:`]+):(?P<line>\d+)")
COPY = re.compile(r"write into a copy \(`(?P<new>.+?)` before `(?P<old>.+?)`\).* at (?P<file>[^\s:`]+):(?P<line>\d+)")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # printed locations are then the bare file names
    torch.set_num_threads(1)


def write(name: str, source: str) -> Path:
    path = Path.cwd() / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def run_plain(path: Path) -> dict[str, torch.Tensor]:
    return runpy.run_path(str(path), run_name="__main__")["result"]


def diagnose(path: Path) -> list[ipd.Finding]:
    """The findings of a run of the program under watch() (it may stop at the in-place error)."""
    session = ipd.watch()
    try:
        with session:
            runpy.run_path(str(path), run_name="__main__")
    except RuntimeError:
        pass
    return [f for f in session.report().findings if f.severity is not Severity.INFO]


def only(findings: list[ipd.Finding], code: str) -> ipd.Finding:
    hits = [f for f in findings if f.code == code]
    assert len(hits) == 1, [(f.code, f.fix) for f in findings]
    return hits[0]


def edit_line(path: Path, line: int, old: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    assert old in lines[line - 1], (lines[line - 1], old)
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path.write_text("".join(lines))


def insert_before(path: Path, line: int, old: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    target = lines[line - 1]
    assert old in target, (target, old)
    indent = target[: len(target) - len(target.lstrip())]
    lines.insert(line - 1, f"{indent}{new}\n")
    path.write_text("".join(lines))


def apply(fix: str, path: Path) -> None:
    """Apply the first edit a printed fix names, where it names it."""
    for pattern in (INSERT, COPY, REPLACE):
        m = pattern.search(fix)
        if m:
            assert Path(m["file"]).name == path.name, (m["file"], path)
            if pattern is REPLACE:
                edit_line(path, int(m["line"]), m["old"], m["new"])
            else:
                insert_before(path, int(m["line"]), m["old"], m["new"])
            return
    m = CONSTRUCT.search(fix)
    assert m, f"no edit in the fix: {fix}"
    assert Path(m["file"]).name == path.name
    edit_line(path, int(m["line"]), "inplace=True", "inplace=False")


def assert_same(fixed: dict[str, torch.Tensor], intended: dict[str, torch.Tensor]) -> None:
    assert fixed.keys() == intended.keys()
    differ = [k for k in fixed if not torch.equal(fixed[k], intended[k])]
    assert not differ, differ


def check(program: str, intended: str, code: str) -> ipd.Finding:
    """Diagnose `program`, apply its `code` finding's fix, and compare with `intended`."""
    path = write("program.py", program)
    finding = only(diagnose(path), code)
    apply(finding.fix, path)
    assert diagnose(path) == [], path.read_text()
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))
    return finding


# -- IPD101 -------------------------------------------------------------------

def test_module_flag_fix_edits_the_constructing_line():
    program = """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(4, 4),
            nn.Sigmoid(),
            nn.ReLU(inplace=True),
            nn.Linear(4, 2),
        )
        out = model(torch.randn(3, 4))
        out.sum().backward()
        result = {"out": out.detach(), **{n: p.grad for n, p in model.named_parameters()}}
    """
    finding = check(program, program.replace("inplace=True", "inplace=False"), "IPD101")
    assert "construct `model.2` with inplace=False at program.py:7" in finding.fix
    assert finding.mutation.origin is not None and finding.mutation.origin.line == 7


def test_augmented_assignment_fix():
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(5, requires_grad=True)
        h = torch.exp(a)
        h += 1
        loss = (h * h).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    finding = check(program, program.replace("h += 1", "h = h + 1"), "IPD101")
    assert "replace `h += 1` with `h = h + 1` at program.py:5" in finding.fix


def test_augmented_assignment_fix_keeps_the_right_hand_side_whole():
    """huggingface/transformers#24525 (OwlViT): `x /= norm + eps` divides by the sum; written out
    of place without brackets it would be `x / norm + eps`, every gradient different."""
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(3, 4, requires_grad=True)
        h = torch.exp(a)
        h /= torch.linalg.norm(h, dim=-1, keepdim=True) + 1e-6
        loss = (h * torch.arange(4.0)).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    intended = program.replace(
        "h /= torch.linalg.norm(h, dim=-1, keepdim=True) + 1e-6",
        "h = h / (torch.linalg.norm(h, dim=-1, keepdim=True) + 1e-6)",
    )
    finding = check(program, intended, "IPD101")
    assert "with `h = h / (torch.linalg.norm(h, dim=-1, keepdim=True) + 1e-6)`" in finding.fix


def test_inplace_method_statement_fix_rebinds_the_name():
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(5, requires_grad=True)
        h = torch.tanh(a)
        h.mul_(2)
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    finding = check(program, program.replace("h.mul_(2)", "h = h * 2"), "IPD101")
    assert "`h = h.mul(2)`" in finding.fix  # not `h.mul(2)`, which would drop the multiplication


def test_functional_inplace_argument_fix():
    program = """
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        a = torch.randn(5, requires_grad=True)
        h = torch.sigmoid(a)
        h = F.hardtanh(h, 0.0, 0.6, inplace=True)
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    check(program, program.replace("inplace=True", "inplace=False"), "IPD101")


def test_indexed_write_fix_writes_into_a_copy():
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(6, requires_grad=True)
        h = torch.sigmoid(a)
        h[h > 0.5] = 0.5
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    intended = program.replace("h[h > 0.5] = 0.5", "h = torch.where(h > 0.5, torch.full_like(h, 0.5), h)")
    finding = check(program, intended, "IPD101")
    assert "`h = h.clone()` before `h[h > 0.5] = 0.5`" in finding.fix


def test_indexed_augmented_assignment_fix_writes_into_a_copy_not_back_into_the_slice():
    """`h[:, 0] = h[:, 0] + 1` would still write into h (a copy into the slice): the fix clones h."""
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(4, 3, requires_grad=True)
        h = torch.sigmoid(a)
        h[:, 0] += 1
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    intended = program.replace("h[:, 0] += 1", "h = torch.cat([h[:, :1] + 1, h[:, 1:]], dim=1)")
    finding = check(program, intended, "IPD101")
    assert "`h = h.clone()` before `h[:, 0] += 1`" in finding.fix
    assert "h[:, 0] = h[:, 0] + 1" not in finding.fix


def test_a_chunk_piece_held_in_an_attribute_is_rebound_not_left_unchanged():
    """IPD103 on one of the views `chunk` returned, written as a whole statement through an
    attribute: the piece-alone choice rebinds `s.hi`, it does not drop the write."""
    program = """
        import torch
        torch.manual_seed(0)
        class State: pass
        s = State()
        a = torch.randn(4, requires_grad=True)
        s.lo, s.hi = (a * 2).chunk(2)
        s.hi.clamp_(-1, 1)
        loss = s.lo.sum() + s.hi.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    finding = check(program, program.replace("s.hi.clamp_(-1, 1)", "s.hi = s.hi.clamp(-1, 1)"), "IPD103")
    assert "rebind it out of place: replace `s.hi.clamp_(-1, 1)` with `s.hi = s.hi.clamp(-1, 1)`" in finding.fix


def test_a_helper_that_mutates_its_argument_gets_a_copy_at_the_call_not_a_dropped_write():
    program = """
        import torch

        def center(batch, mean):
            batch -= mean

        torch.manual_seed(0)
        w = torch.randn(4, 4, requires_grad=True)
        h = torch.tanh(torch.randn(3, 4) @ w)
        center(h, h.mean(0).detach())
        loss = (h * h).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": w.grad}
    """
    intended = program.replace("center(h, h.mean(0).detach())", "h = h - h.mean(0).detach()")
    finding = check(program, intended, "IPD101")
    assert "`center` writes into its argument (program.py:4)" in finding.fix
    assert "insert `h = h.clone()` before `center(h, h.mean(0).detach())` at program.py:9" in finding.fix
    # The printed `x -= y` -> `x = x - y` rewrite would have made the subtraction vanish:
    dropped = write("dropped.py", program.replace("batch -= mean", "batch = batch - mean"))
    assert not torch.equal(run_plain(dropped)["loss"], run_plain(write("intended.py", intended))["loss"])
    # ... and the intended mutation is not called a silent change (IPD105) either.
    assert diagnose(write("fixed.py", intended)) == []


GAN = """
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4))
    D = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    opt_g = torch.optim.SGD(G.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(D.parameters(), lr=0.1)
    real, z = torch.randn(6, 4), torch.randn(6, 3)
    fake = G(z)
    d_fake = D(fake)
    loss_d = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    # REPLACE
    loss_g = F.softplus(-d_fake).mean()
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()
    result = {**{f"G.{n}": p.detach().clone() for n, p in G.named_parameters()},
              **{f"D.{n}": p.detach().clone() for n, p in D.named_parameters()}}
"""


def test_optimizer_step_fix_offers_the_recompute_and_says_what_moving_the_step_changes():
    path = write("gan.py", GAN)
    finding = only(diagnose(path), "IPD101")
    assert finding.confirmed is True and finding.severity is Severity.ERROR
    assert "D.2.weight" in finding.places or "D.0.weight" in finding.places, finding.places
    fix = finding.fix
    assert "again after `SGD.step` at gan.py:16" in fix and "the backward at gan.py:20" in fix
    assert "loss.backward(inputs=[...])" in fix and "accumulates into D's `.grad`" in fix

    # The intended program (pytorch/examples' DCGAN): the generator's loss through the stepped D.
    recompute = GAN.replace("    # REPLACE\n    loss_g = F.softplus(-d_fake).mean()", "    loss_g = F.softplus(-D(fake)).mean()")
    fixed = write("recompute.py", recompute)
    assert diagnose(fixed) == []
    intended = run_plain(fixed)

    # The other printed option: the step after the generator's backward, that backward limited to G.
    moved = (
        GAN.replace("    opt_d.step()\n", "")
        .replace("    loss_g.backward()", "    loss_g.backward(inputs=list(G.parameters()))\n    opt_d.step()")
    )
    moved_result = run_plain(write("moved.py", moved))
    d_keys = [k for k in intended if k.startswith("D.")]
    for k in d_keys:  # D's update is exactly the one its own loss asked for
        assert torch.equal(moved_result[k], intended[k]), k
    # ... whereas moving the step alone lets G's loss leak into D's update, as the fix warns.
    naive = run_plain(write("naive.py", GAN.replace("    opt_d.step()\n", "").replace("    opt_g.step()", "    opt_g.step()\n    opt_d.step()")))
    assert any(not torch.equal(naive[k], intended[k]) for k in d_keys)


def test_a_parameter_update_under_no_grad_is_ordered_not_dropped():
    program = """
        import torch
        from torch import nn
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(2, 4, requires_grad=True)
        y = torch.sigmoid(lin(x))
        with torch.no_grad():
            lin.weight.mul_(0.5)
        # RECOMPUTE
        y.sum().backward()
        result = {"x.grad": x.grad, "w": lin.weight.detach().clone(), "w.grad": lin.weight.grad}
    """
    path = write("update.py", program)
    finding = only(diagnose(path), "IPD101")
    assert "`Sequential" not in finding.fix and ".mul(" not in finding.fix  # the update is kept
    assert "again after the update of `lin.weight` at update.py:8" in finding.fix
    fixed = write("fixed.py", program.replace("# RECOMPUTE", "y = torch.sigmoid(lin(x))"))
    assert diagnose(fixed) == []
    intended = textwrap.dedent(program).replace("y = torch.sigmoid(lin(x))\n", "", 1).replace(
        "# RECOMPUTE", "y = torch.sigmoid(lin(x))"
    )
    assert_same(run_plain(fixed), run_plain(write("intended.py", intended)))


# -- IPD104 -------------------------------------------------------------------

def test_a_data_write_fix_makes_it_out_of_place_on_the_tensor_itself():
    program = """
        import torch
        torch.manual_seed(0)
        logits = torch.randn(4, 3, requires_grad=True)
        probs = torch.softmax(logits, 1)
        probs.data.clamp_(min=0.2)
        loss = -(probs.log() * torch.eye(3)[[0, 1, 2, 0]]).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": logits.grad}
    """
    finding = check(program, program.replace("probs.data.clamp_(min=0.2)", "probs = probs.clamp(min=0.2)"), "IPD104")
    assert finding.confirmed is True  # backward read the clamped values
    assert "replace `probs.data.clamp_(min=0.2)` with `probs = probs.clamp(min=0.2)`" in finding.fix


# -- IPD105 / IPD106 ----------------------------------------------------------

def test_residual_read_after_an_inplace_flag_fix():
    program = """
        import torch
        from torch import nn
        torch.manual_seed(0)

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)
                self.act = nn.ReLU(inplace=True)

            def forward(self, x):
                h = self.fc(x)
                return h + self.act(h)

        model = Block()
        out = model(torch.randn(3, 4))
        out.sum().backward()
        result = {"out": out.detach(), **{n: p.grad for n, p in model.named_parameters()}}
    """
    finding = check(program, program.replace("inplace=True", "inplace=False"), "IPD105")
    assert "at program.py:9 (`self.act = nn.ReLU(inplace=True)`)" in finding.fix


def test_first_layer_inplace_flag_writing_the_callers_batch_fix():
    program = """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 2))
        x = torch.randn(3, 4)
        out = model(x)
        out.sum().backward()
        result = {"out": out.detach(), "x": x.clone(), **{n: p.grad for n, p in model.named_parameters()}}
    """
    check(program, program.replace("inplace=True", "inplace=False"), "IPD106")


# -- IPD107 -------------------------------------------------------------------

def test_state_dict_snapshot_fix_takes_a_real_copy():
    program = """
        import copy
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        best = model.state_dict()
        opt.step()
        model.load_state_dict(best)
        result = {k: v.detach().clone() for k, v in model.state_dict().items()}
    """
    path = write("program.py", program)
    finding = only(diagnose(path), "IPD107")
    assert finding.severity is Severity.WARNING and "copy.deepcopy(model.state_dict())" in finding.fix
    m = re.search(r"take a real snapshot at (?P<file>[^\s:]+):(?P<line>\d+)", finding.fix)
    assert m and m["file"] == "program.py" and int(m["line"]) == 8
    edit_line(path, 8, "model.state_dict()", "copy.deepcopy(model.state_dict())")
    assert diagnose(path) == []
    intended = textwrap.dedent(program).replace("opt.step()\n", "").replace("best = model.state_dict()\n", "").replace(
        "model.load_state_dict(best)\n", ""
    )
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))


# -- IPD102 / IPD103 ----------------------------------------------------------

def test_leaf_update_fix_wraps_it_in_no_grad():
    program = """
        import torch
        torch.manual_seed(0)
        w = torch.randn(3, requires_grad=True)
        (w * 2).sum().backward()
        w.sub_(0.1 * w.grad)
        result = {"w": w.detach().clone()}
    """
    path = write("program.py", program)
    finding = only(diagnose(path), "IPD102")
    assert "wrap it in `with torch.no_grad():`" in finding.fix
    path.write_text(path.read_text().replace("w.sub_(0.1 * w.grad)", "with torch.no_grad():\n    w.sub_(0.1 * w.grad)"))
    assert diagnose(path) == []
    intended = program.replace("w.sub_(0.1 * w.grad)", "w = (w - 0.1 * w.grad).detach()")
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))


def test_expanded_tensor_fix_clones_before_the_write():
    program = """
        import torch
        torch.manual_seed(0)
        bias = torch.randn(1, 4)
        h = bias.expand(3, 4)
        h.add_(1)
        result = {"h": h}
    """
    path = write("program.py", program)
    finding = only(diagnose(path), "IPD103")
    assert "`.clone()`" in finding.fix
    edit_line(path, 4, "bias.expand(3, 4)", "bias.expand(3, 4).clone()")
    assert diagnose(path) == []
    intended = textwrap.dedent(program).replace("h = bias.expand(3, 4)\nh.add_(1)", "h = bias.expand(3, 4) + 1")
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))


# -- IPD108 / IPD103 (hooked outputs) ---------------------------------------------

CHECKPOINTED_BN = """
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False)
    y.sum().backward()
    result = {"y": y.detach(), "x.grad": x.grad, **{k: v.clone() for k, v in block.state_dict().items()}}
"""


def test_batchnorm_in_a_checkpoint_fix_moves_it_out_and_its_statistics_are_updated_once():
    path = write("program.py", CHECKPOINTED_BN)
    findings = diagnose(path)
    assert findings and {f.code for f in findings} == {"IPD108"}
    assert all("keep BatchNorm" in f.fix and "out of the checkpointed region" in f.fix for f in findings)
    source = textwrap.dedent(CHECKPOINTED_BN)
    fixed = write("fixed.py", source.replace("checkpoint(block, x, use_reentrant=False)", "block[1](checkpoint(block[0], x, use_reentrant=False))"))
    assert diagnose(fixed) == []
    intended = run_plain(write("intended.py", source.replace("checkpoint(block, x, use_reentrant=False)", "block(x)")))
    assert_same(run_plain(fixed), intended)
    # The unfixed program's running statistics moved twice: that is what the finding is about.
    assert not torch.equal(run_plain(path)["1.running_mean"], intended["1.running_mean"])


def test_hooked_module_output_fix_turns_the_inplace_flags_off():
    program = """
        import torch
        import torchvision
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=4)
        model.bn1.register_full_backward_hook(lambda module, grad_in, grad_out: None)
        # FIX
        out = model(torch.randn(2, 3, 32, 32))
        out.sum().backward()
        result = {"out": out.detach(), "conv1.grad": model.conv1.weight.grad}
    """
    path = write("program.py", program)
    finding = only(diagnose(path), "IPD103")
    assert "for m in model.modules(): m.inplace = False" in finding.fix
    snippet = re.search(r"`(for m in model\.modules\(\): m\.inplace = False)` where it has the attribute", finding.fix)
    assert snippet
    # Applied as printed, limited to modules that have the attribute, as the fix says.
    path.write_text(path.read_text().replace("# FIX", "for m in model.modules():\n    if hasattr(m, 'inplace'): m.inplace = False"))
    assert diagnose(path) == []
    intended = program.replace(
        "# FIX", "for m in model.modules():\n            if isinstance(m, torch.nn.ReLU): m.inplace = False"
    )
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))


# -- IPD109 -------------------------------------------------------------------

def test_numpy_write_fix_gives_numpy_a_copy():
    program = """
        import torch
        torch.manual_seed(0)
        w = torch.randn(6, requires_grad=True)
        s = torch.sigmoid(w * 3)
        a = s.detach().numpy()
        a *= 0.5
        s.sum().backward()
        result = {"s": s.detach().clone(), "a": torch.from_numpy(a.copy()), "w.grad": w.grad}
    """
    path = write("program.py", program)
    finding = only(diagnose(path), "IPD109")
    assert finding.confirmed
    assert "hand out a copy: replace `s.detach().numpy()` with `s.detach().numpy().copy()` at program.py:5" in finding.fix
    broken = run_plain(path)
    apply(finding.fix, path)
    assert diagnose(path) == [], path.read_text()
    # What was meant: the halved values for display, the gradient of the sigmoid as computed.
    intended = run_plain(write("intended.py", program.replace("s.detach().numpy()", "s.detach().clone().numpy()")))
    assert_same(run_plain(path), intended)
    assert not torch.equal(broken["w.grad"], intended["w.grad"])  # the unfixed gradient was silently wrong


# -- IPD110 -------------------------------------------------------------------

_MASKED = """
    import torch
    from torch import nn
    torch.manual_seed(0)
    fc, head = nn.Linear(8, 8), nn.Linear(8, 1)
    h = fc(torch.randn(4, 8))
    h.detach()[h < 0] = 0
    loss = head(h).sum()
    loss.backward()
    result = {"loss": loss.detach(), "fc.grad": fc.weight.grad, "head.grad": head.weight.grad}
"""


def test_a_masked_write_through_detach_fix_records_the_mask_in_the_graph():
    intended = _MASKED.replace("h.detach()[h < 0] = 0", "h = torch.where(h < 0, torch.zeros_like(h), h)")
    finding = check(_MASKED, intended, "IPD110")
    assert finding.confirmed is True
    assert "replace `h.detach()[h < 0] = 0` with `h = h.masked_fill(h < 0, 0)`" in finding.fix
    # The unfixed program gives fc the gradient of the unmasked tensor: what the finding is about.
    written = run_plain(write("unfixed.py", _MASKED))
    assert not torch.equal(written["fc.grad"], run_plain(write("again.py", intended))["fc.grad"])
    assert torch.equal(written["loss"], run_plain(write("again.py", intended))["loss"])  # same forward


def test_a_masked_write_fix_that_cuts_the_history_sends_no_gradient_into_it():
    path = write("program.py", _MASKED)
    finding = only(diagnose(path), "IPD110")
    assert "cut it explicitly before the write (`h = h.detach()`, then write into it)" in finding.fix
    insert_before(path, line_of_text(path, "h.detach()[h < 0] = 0"), "h.detach()", "h = h.detach()")
    assert diagnose(path) == []
    result = runpy.run_path(str(path), run_name="__main__")
    assert result["fc"].weight.grad is None and result["head"].weight.grad is not None


def test_a_data_rescale_fix_puts_the_factor_into_the_gradient():
    program = _MASKED.replace("h.detach()[h < 0] = 0", "h.data.mul_(2)")
    finding = check(program, program.replace("h.data.mul_(2)", "h = h * 2"), "IPD110")
    assert "replace `h.data.mul_(2)` with `h = h.mul(2)`" in finding.fix


def test_a_no_grad_write_fix_moves_the_out_of_place_op_out_of_the_block():
    """The write alone in its `no_grad` block: the record replaces the block by the out-of-place write
    (before, a regular expression printed `h = h.mul(2)` for the line and "move it out of the block",
    with no edit behind it)."""
    program = _MASKED.replace("h.detach()[h < 0] = 0", "with torch.no_grad():\n        h.mul_(2)")
    path = write("program.py", program)
    finding = only(diagnose(path), "IPD110")
    (edit,) = finding.fixes[0].edits
    assert (edit.old, edit.new) == ("with torch.no_grad():\n    h.mul_(2)", "h = h.mul(2)")
    assert f"replace `with torch.no_grad(): h.mul_(2)` with `h = h.mul(2)` at program.py:{edit.start.line}" in finding.fix
    text = path.read_text()
    path.write_text(text.replace(edit.old, edit.new, 1))
    assert diagnose(path) == []
    assert_same(run_plain(path), run_plain(write("intended.py", program.replace(
        "with torch.no_grad():\n        h.mul_(2)", "h = h * 2"))))


def test_a_no_grad_write_that_is_not_alone_in_its_block_is_said_in_words():
    program = _MASKED.replace("h.detach()[h < 0] = 0", "with torch.no_grad():\n        s = 2\n        h.mul_(s)")
    finding = only(diagnose(write("program.py", program)), "IPD110")
    assert not any(fx.edits for fx in finding.fixes) and "replace `" not in finding.fix  # said in words: a manual record
    assert "move it out of the `torch.no_grad()` block" in finding.fix, finding.fix


def line_of_text(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
