"""Fixes as records: every fix template's `Edit`s, built from the source at the sites, applied as data.

Each case is a small program written to a file, run under `watch()`; the
finding's `fixes[0]` edits are spliced into the file (the edit's path, range
and `old` text checked, nothing read from a sentence), and the edited program
must run clean and compute what the intended program computes, bit for bit.
"""

from __future__ import annotations

import runpy
import textwrap
from pathlib import Path

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.findings import Applicability, Edit, Fix, FixKind, Position


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)


def write(name: str, source: str) -> Path:
    path = Path.cwd() / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def run_plain(path: Path) -> dict[str, torch.Tensor]:
    return runpy.run_path(str(path), run_name="__main__")["result"]


def diagnose(path: Path) -> list[ipd.Finding]:
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


def _offset(text: str, at: Position) -> int:
    lines = text.splitlines(keepends=True)
    return sum(len(line) for line in lines[: at.line - 1]) + at.column


def apply(fix: Fix) -> None:
    """Splice a fix's edits into their files (last first, so earlier offsets hold)."""
    for edit in sorted(fix.edits, key=lambda e: (e.path, e.start), reverse=True):
        path = Path(edit.path)
        text = path.read_text()
        start, end = _offset(text, edit.start), _offset(text, edit.end)
        assert text[start:end] == edit.old, (text[start:end], edit)
        path.write_text(text[:start] + edit.new + text[end:])


def assert_same(fixed: dict[str, torch.Tensor], intended: dict[str, torch.Tensor]) -> None:
    assert fixed.keys() == intended.keys()
    differ = [k for k in fixed if not torch.equal(fixed[k], intended[k])]
    assert not differ, differ


def check(program: str, intended: str, code: str, kind: FixKind) -> ipd.Finding:
    path = write("program.py", program)
    finding = only(diagnose(path), code)
    fix = finding.fixes[0]
    assert fix.kind is kind and fix.applicability is Applicability.UNSAFE, finding.fixes  # proven only by `fix`
    assert all(Path(e.path) == path for e in fix.edits), fix.edits
    apply(fix)
    assert diagnose(path) == [], path.read_text()
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))
    return finding


def test_clone_before_an_indexed_write():
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
    finding = check(program, intended, "IPD101", FixKind.CLONE_BEFORE_WRITE)
    (edit,) = finding.fixes[0].edits
    assert (edit.start, edit.end, edit.old, edit.new) == (Position(5, 0), Position(5, 0), "", "h = h.clone()\n")


def test_augmented_assignment_out_of_place_keeps_the_right_hand_side_whole():
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
    new = "h = h / (torch.linalg.norm(h, dim=-1, keepdim=True) + 1e-6)"
    finding = check(program, program.replace("h /= torch.linalg.norm(h, dim=-1, keepdim=True) + 1e-6", new), "IPD101", FixKind.OUT_OF_PLACE)
    assert finding.fixes[0].edits[0].new == new


def test_inplace_method_statement_is_rebound():
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(5, requires_grad=True)
        h = torch.tanh(a)
        h.mul_(2)  # double it
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    finding = check(program, program.replace("h.mul_(2)", "h = h * 2"), "IPD101", FixKind.REBIND)
    assert finding.fixes[0].edits[0].old == "h.mul_(2)"  # the comment stays where it was


def test_flag_off_at_the_constructor():
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
    finding = check(program, program.replace("inplace=True", "inplace=False"), "IPD101", FixKind.FLAG_OFF_AT_CONSTRUCTOR)
    (edit,) = finding.fixes[0].edits
    assert (edit.start.line, edit.old, edit.new) == (7, "True", "False")


def test_flag_off_at_a_functional_call():
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
    check(program, program.replace("inplace=True", "inplace=False"), "IPD101", FixKind.FLAG_OFF_AT_CALL)


def test_a_data_write_is_made_on_the_tensor_itself():
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
    intended = program.replace("probs.data.clamp_(min=0.2)", "probs = probs.clamp(min=0.2)")
    check(program, intended, "IPD104", FixKind.REBIND)


def test_a_helper_writing_its_argument_gets_a_copy_at_the_call():
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
    finding = check(program, intended, "IPD101", FixKind.CLONE_BEFORE_WRITE)
    assert finding.fixes[0].edits[0].start == Position(9, 0)  # at the call, not in the helper


def test_the_edit_lands_in_the_sites_file_whatever_the_line_says():
    """Issue 23, item 1: a string on the written line naming another file and line changes nothing."""
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(6, requires_grad=True)
        h = torch.sigmoid(a)
        h[h > 0.5] = len(" at other.py:2 resumed at epoch:10") * 0.0
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    other = write("other.py", "x = 1\ny = 2\n")
    intended = program.replace(
        'h[h > 0.5] = len(" at other.py:2 resumed at epoch:10") * 0.0',
        "h = torch.where(h > 0.5, torch.zeros_like(h), h)",
    )
    finding = check(program, intended, "IPD101", FixKind.CLONE_BEFORE_WRITE)
    assert {Path(e.path).name for e in finding.fixes[0].edits} == {"program.py"}
    assert other.read_text() == "x = 1\ny = 2\n"


def test_a_save_inside_the_writing_statement_computes_first_then_writes_a_copy():
    """Issue 23, item 2: `mul` saves views of `buf` and the assignment writes `buf`; a clone before
    the statement would be read and written alike, so the fix computes the value, then writes a copy."""
    program = """
        import torch
        torch.manual_seed(0)
        x = torch.randn(5, requires_grad=True)
        buf = x * 1
        buf[4] = torch.mul(buf[2], buf[3])
        loss = buf.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": x.grad}
    """
    intended = program.replace(
        "buf[4] = torch.mul(buf[2], buf[3])", "buf = torch.cat([buf[:4], (buf[2] * buf[3]).reshape(1)])"
    )
    finding = check(program, intended, "IPD101", FixKind.COMPUTE_THEN_WRITE)
    assert not any(f.kind is FixKind.CLONE_BEFORE_WRITE for f in finding.fixes)
    assert finding.fixes[0].edits[0].new == "value = torch.mul(buf[2], buf[3])\nbuf = buf.clone()\nbuf[4] = value"


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
    loss_g = F.softplus(-d_fake).mean()
    opt_g.zero_grad()
    loss_g.backward()  # the generator's
    opt_g.step()
    result = {f"D.{n}": p.detach().clone() for n, p in D.named_parameters()}
"""


def test_an_optimizer_step_is_moved_after_the_backward_and_recomputing_is_manual():
    """Issue 23, item 3 (the builder's side): the move is edits (delete the step, insert it after
    the backward), offered unsafe; recomputing the forward is the manual alternative."""
    path = write("gan.py", GAN)
    finding = only(diagnose(path), "IPD101")
    kinds = [(f.kind, f.applicability) for f in finding.fixes]
    assert kinds == [(FixKind.RECOMPUTE, Applicability.MANUAL), (FixKind.UPDATE_FIRST, Applicability.UNSAFE),
                     (FixKind.MOVE_STATEMENT, Applicability.UNSAFE)]
    delete, insert = finding.fixes[2].edits
    assert delete == Edit(str(path), Position(16, 0), Position(17, 0), "opt_d.step()\n", "")
    assert insert == Edit(str(path), Position(19, 36), Position(19, 36), "", "\nopt_d.step()")
    apply(finding.fixes[2])
    assert "loss_g.backward()  # the generator's\nopt_d.step()\nopt_g.step()" in path.read_text()
    assert diagnose(path) == []


def test_the_later_update_is_moved_before_the_step_with_its_own_lines():
    """Issue 37, item 7: the generator's update (its loss, zero_grad, backward and step) moved before
    the discriminator's, from the same forward: the finding goes, and the discriminator trains on
    its own loss alone (its zero_grad clears what the generator's backward left in its `.grad`)."""
    path = write("gan.py", GAN)
    finding = only(diagnose(path), "IPD101")
    first = finding.fixes[1]
    insert, delete = first.edits
    moved = "loss_g = F.softplus(-d_fake).mean()\nopt_g.zero_grad()\nloss_g.backward()  # the generator's\nopt_g.step()\n"
    assert insert == Edit(str(path), Position(14, 0), Position(14, 0), "", moved)
    assert delete == Edit(str(path), Position(17, 0), Position(21, 0), moved, "")
    intended = run_plain(write("intended.py", GAN.replace("    fake = G(z)\n", "    fake = G(z)\n    D_old = copy.deepcopy(D)\n")
                                .replace("d_fake = D(fake)", "d_fake = D_old(fake)").replace("    import torch\n", "    import copy\n    import torch\n", 1)))
    apply(first)
    assert diagnose(path) == []
    assert_same(run_plain(path), intended)


def test_a_fix_without_a_literal_flag_is_manual():
    program = """
        import torch
        from torch import nn
        torch.manual_seed(0)
        flag = True
        model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU(inplace=flag), nn.Linear(4, 2))
        out = model(torch.randn(3, 4))
        out.sum().backward()
    """
    finding = only(diagnose(write("program.py", program)), "IPD101")
    assert [(f.kind, f.applicability, f.edits) for f in finding.fixes] == [
        (FixKind.FLAG_OFF_AT_CONSTRUCTOR, Applicability.MANUAL, ())
    ]


def test_two_writes_to_one_saved_tensor_offer_one_fix_per_write_as_alternatives():
    """Issue 23, item 4: the first write made out of place already keeps the second off the saved
    tensor; the findings say so and carry one fix per write, earliest first, never "each must change"."""
    program = """
        import torch
        torch.manual_seed(0)
        a = torch.randn(5, requires_grad=True)
        h = torch.sigmoid(a)
        h.mul_(2)
        h.add_(1)
        loss = h.pow(2).sum()
        loss.backward()
        result = {"loss": loss.detach(), "grad": a.grad}
    """
    path = write("program.py", program)
    findings = [f for f in diagnose(path) if f.code == "IPD101"]
    assert sorted(f.mutation.line for f in findings) == [5, 6]
    for f in findings:
        assert [(x.kind, x.edits[0].start.line) for x in f.fixes] == [(FixKind.REBIND, 5), (FixKind.REBIND, 6)]
    first = next(f for f in findings if f.mutation.line == 5)
    assert "each must" not in first.why and "changing one write can be enough" in first.why
    apply(first.fixes[0])  # the first write alone
    assert diagnose(path) == [], path.read_text()
    intended = program.replace("h.mul_(2)\n", "h = h.mul(2)\n")
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))


def test_a_parameter_update_under_no_grad_moves_with_its_block():
    program = """
        import torch
        from torch import nn
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(2, 4, requires_grad=True)
        y = torch.sigmoid(lin(x))
        with torch.no_grad():
            lin.weight.mul_(0.5)
        y.sum().backward()
        result = {"x.grad": x.grad, "w": lin.weight.detach().clone(), "w.grad": lin.weight.grad}
    """
    path = write("update.py", program)
    finding = only(diagnose(path), "IPD101")
    move = next(f for f in finding.fixes if f.kind is FixKind.MOVE_STATEMENT)
    assert move.edits[0].old == "with torch.no_grad():\n    lin.weight.mul_(0.5)\n"
    apply(move)
    assert diagnose(path) == []
    intended = textwrap.dedent(program).replace(
        "with torch.no_grad():\n    lin.weight.mul_(0.5)\ny.sum().backward()\n",
        "y.sum().backward()\nwith torch.no_grad():\n    lin.weight.mul_(0.5)\n",
    )
    assert_same(run_plain(path), run_plain(write("intended.py", intended)))


@pytest.mark.parametrize(
    ("statement", "code"),
    [
        ("h[h > 0.5] = 0.5", "IPD101"),
        ("h += 1", "IPD101"),
        ("h.mul_(2)", "IPD101"),
        ("h = torch.nn.functional.hardtanh(h, 0.0, 0.6, inplace=True)", "IPD101"),
    ],
)
def test_the_printed_fix_is_made_from_the_record_and_reads_as_the_rule_says(statement: str, code: str):
    from inplace_doctor.render.fix_text import fix_lines

    program = f"""
        import torch
        torch.manual_seed(0)
        a = torch.randn(6, requires_grad=True)
        h = torch.sigmoid(a)
        {statement}  # the write
        h.sum().backward()
    """
    finding = only(diagnose(write("program.py", program)), code)
    assert fix_lines(finding, "model") == [f"fix: {finding.fix}"]
    proven = finding.with_(fixes=tuple(x.__class__(x.kind, x.edits, Applicability.PROVEN) for x in finding.fixes))
    assert fix_lines(proven, "model")[0].endswith("(proven on this program: `inplace-doctor fix` applies it)")


def test_the_rules_own_sentence_never_offers_the_clone_that_cannot_help():
    """Issue 23, item 2, in the message too (the JSON's `fix`, the error's text): no `buf = buf.clone()`
    before a statement whose value reads `buf`."""
    program = """
        import torch
        x = torch.randn(5, requires_grad=True)
        buf = x * 1
        buf[4] = torch.mul(buf[2], buf[3])
        buf.pow(2).sum().backward()
    """
    finding = only(diagnose(write("program.py", program)), "IPD101")
    assert "before `buf[4]" not in finding.fix and "compute the value first" in finding.fix


def test_numpy_memory_is_copied_where_it_is_handed_out():
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
    intended = program.replace("s.detach().numpy()", "s.detach().clone().numpy()")
    finding = check(program, intended, "IPD109", FixKind.COPY_AT_HANDOUT)
    assert finding.fixes[0].edits[0].new == "s.detach().numpy().copy()"


@pytest.mark.parametrize("imports", ["import copy\n        ", ""])
def test_a_state_dict_snapshot_is_copied_where_it_is_taken(imports: str):
    program = f"""
        {imports}import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        best = model.state_dict()
        opt.step()
        model.load_state_dict(best)
        result = {{k: v.detach().clone() for k, v in model.state_dict().items()}}
    """
    intended = (
        textwrap.dedent(program).replace("opt.step()\n", "").replace("best = model.state_dict()\n", "")
        .replace("model.load_state_dict(best)\n", "")
    )
    finding = check(program, intended, "IPD107", FixKind.COPY_AT_HANDOUT)
    new = finding.fixes[0].edits[0].new
    assert new == ("copy.deepcopy(model.state_dict())" if imports else "{k_1: v_1.detach().clone() for k_1, v_1 in model.state_dict().items()}")


@pytest.mark.parametrize(
    ("name", "encoding", "newline", "head"),
    [
        ("crlf.py", "utf-8", "\r\n", ""),
        ("bom.py", "utf-8-sig", "\n", ""),
        ("latin1.py", "latin-1", "\n", "# -*- coding: latin-1 -*-\n"),
    ],
)
def test_edit_columns_count_characters_of_the_decoded_line(name: str, encoding: str, newline: str, head: str):
    """A BOM, a PEP 263 encoding or CRLF line endings move no edit: columns are characters of the
    decoded line (ast's are UTF-8 bytes), lines as Python counts them."""
    from inplace_doctor.rules.fixes.fix_builders import write_fixes
    from inplace_doctor.sites import Site

    source = head + 'import torch.nn.functional as F\nh = F.hardtanh(h, len("été") - 3.0, 0.6, inplace=True)\nh += 1\n'
    path = Path.cwd() / name
    path.write_bytes(source.replace("\n", newline).encode(encoding))
    first = 2 + bool(head)
    decoded = source.splitlines()
    (flag,) = write_fixes(Site(op="aten.hardtanh_", file=str(path), line=first))
    (edit,) = flag.edits
    assert decoded[edit.start.line - 1][edit.start.column : edit.end.column] == "True" == edit.old
    (augmented,) = write_fixes(Site(op="aten.add_", file=str(path), line=first + 1))
    assert augmented.edits[0].start == Position(first + 1, 0) and augmented.edits[0].new == "h = h + 1"


def test_a_write_inside_an_installed_package_gets_no_edit():
    """torchvision's `out += identity` runs in site-packages: the fix there is the user's to decide
    (the module's flag, a copy of its input), never an edit of the library."""
    import inspect

    import torchvision

    from inplace_doctor.rules.fixes.fix_builders import write_fixes
    from inplace_doctor.sites import Site

    path = inspect.getfile(torchvision.models.resnet)
    line = next(i for i, text in enumerate(Path(path).read_text().splitlines(), 1) if "out += identity" in text)
    assert write_fixes(Site(op="aten.add_", file=path, line=line)) == ()


def test_an_inplace_function_of_a_module_is_not_rebound_as_if_it_were_a_method():
    """`torch.nn.init.zeros_(w)` is no tensor's method: `torch.nn.init = torch.nn.init.zeros(w)` would be
    nonsense, and `init` has no `zeros`: no edit. `F.relu_(h)` is rebound on its argument with the
    twin the imported module has (`h = F.relu(h)`), never on the module."""
    from inplace_doctor.rules.fixes.fix_builders import write_fixes
    from inplace_doctor.sites import Site

    path = write("program.py", """
        import torch
        from torch.nn import init
        import torch.nn.functional as F
        torch.nn.init.zeros_(w)
        init.ones_(w)
        F.relu_(h)
        y = F.relu_(h)
        h.relu_()
    """)
    fixes = {line: write_fixes(Site(op="aten.zero_", file=str(path), line=line)) for line in range(4, 9)}
    assert fixes[4] == fixes[5] == ()  # torch.nn.init has no out-of-place twin
    assert [e.new for e in fixes[6][0].edits] == ["h = F.relu(h)"]
    assert [(e.old, e.new) for e in fixes[7][0].edits] == [("F.relu_(h)", "F.relu(h)")]
    assert [e.new for e in fixes[8][0].edits] == ["h = h.relu()"]


POLYAK = """
    import torch
    from torch import nn
    torch.manual_seed(0)
    critic, target, actor = nn.Linear(3, 1), nn.Linear(3, 1), nn.Linear(3, 3)
    target.load_state_dict(critic.state_dict())
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
    s = torch.randn(4, 3)
    q = critic(torch.tanh(actor(s)))
    critic_loss = (critic(s) - 1).pow(2).mean()
    opt_c.zero_grad()
    critic_loss.backward()
    opt_c.step()
    with torch.no_grad():
        for p, tp in zip(critic.parameters(), target.parameters()):
            tp.mul_(0.5).add_(0.5 * p)
    actor_loss = -q.mean()
    actor_loss.backward()
    result = {"target.weight": target.weight.detach().clone(), "actor.grad": actor.weight.grad}
"""


def test_moving_a_step_past_code_that_reads_the_stepped_parameters_is_offered_unsafe_and_differs():
    """Issue 23, item 3, the builder's side: the step move is built as edits but never called safe.
    Moved past the Polyak update, that update reads the weights before the step, so the target net
    differs from the program as it ran (its saved tensors copied at save: what the user meant)."""
    path = write("polyak.py", POLYAK)
    finding = only(diagnose(path), "IPD101")
    move = next(f for f in finding.fixes if f.kind is FixKind.MOVE_STATEMENT)
    assert move.applicability is Applicability.UNSAFE and [e.old for e in move.edits] == ["opt_c.step()\n", ""]
    assert finding.fixes[0].kind is FixKind.RECOMPUTE and finding.fixes[0].applicability is Applicability.MANUAL
    from inplace_doctor.render.fix_text import fix_lines

    lines = fix_lines(finding, "model")
    assert any("code between the two that reads the parameters reads them before the update" in line for line in lines)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        intended = run_plain(path)  # every saved tensor copied at save: the forward as it ran
    apply(move)
    assert diagnose(path) == []  # the finding is gone ...
    moved = run_plain(path)
    assert torch.equal(moved["actor.grad"], intended["actor.grad"])
    assert not torch.equal(moved["target.weight"], intended["target.weight"])  # ... and training changed


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


@pytest.mark.parametrize(
    ("statement", "new", "intended"),
    [
        ("h.detach()[h < 0] = 0", "h = h.masked_fill(h < 0, 0)", "h = torch.where(h < 0, torch.zeros_like(h), h)"),
        ("h.detach()[:, 0] = 0", "h = h.clone()\nh[:, 0] = 0", "h = torch.cat([torch.zeros_like(h[:, :1]), h[:, 1:]], 1)"),
        ("h.detach().mul_(2)", "h = h.mul(2)", "h = h * 2"),
        ("h.data.mul_(2)", "h = h.mul(2)", "h = h * 2"),
    ],
)
def test_a_write_autograd_did_not_record_is_made_on_the_tensor_itself(statement: str, new: str, intended: str):
    program = _MASKED.replace("h.detach()[h < 0] = 0", statement)
    finding = check(program, program.replace(statement, intended), "IPD110", finding_kind(new))
    assert finding.fixes[0].edits[0].new == new
    from inplace_doctor.render.fix_text import fix_lines

    assert "so autograd records the change" in fix_lines(finding, "model")[0]


def finding_kind(new: str) -> FixKind:
    return FixKind.REBIND if ".mul(" in new else FixKind.OUT_OF_PLACE
