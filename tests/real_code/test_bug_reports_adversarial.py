"""More real in-place bug reports, under both tracers, each with the fix the finding carries.

Each program under tests/real_code/bug_reports_more/ is one public report (URL in its docstring),
cut down to a few layers, ending by binding `result`. For each:

- `test_names_both_lines[...-fast|deep]`: the default (fast) tracer and the deep one report the
  expected rule and severity, naming the overwriting line and the saving line (`# <write>` /
  `# <saved>` markers), confirmed by the backward that raised.
- `test_fix_...`: the fix the finding carries is applied to a copy of the program (its `Edit`s, by
  the engine `inplace-doctor fix` uses; a manual fix in its most literal reading, spelled out in the
  test), and the fixed program must run, draw no finding, and compute bit for bit what the intended
  program (the upstream fix, or the thread's) computes.

What tests/real_code/test_bug_reports.py covers is not repeated here: these are other patterns
(index assignment into a saved output, `exp` then `/=`, `pow` then `/=`, `+=` on ReLU outputs
summed across FPEM stages, a module's forward renormalizing a weight another op saved, optimizer
steps of critics before the actor's backward, a GAN's D step before G's backward, an in-place
Dropout after an in-place LeakyReLU, a loop that carries an LSTM state across steps, an in-place
ReLU on an input a custom autograd.Function saved).
"""

from __future__ import annotations

import gc
import runpy
import shutil
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.cli.proof.source_edits import plan, write_all
from inplace_doctor.findings import Fix, FixKind

PROGRAMS = Path(__file__).resolve().parent / "bug_reports_more"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # printed locations are then the bare file names
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- helpers -----------------------------------------------------------------------------------------


def program(name: str) -> Path:
    path = Path.cwd() / f"{name}.py"
    shutil.copyfile(PROGRAMS / f"{name}.py", path)
    return path


def derived(name: str, new_name: str, *edits: tuple[str, str]) -> Path:
    """bug_reports_more/<name>.py with each (old, new) replaced in its code (not its docstring)."""
    source = (PROGRAMS / f"{name}.py").read_text()
    end = source.index('"""', 3) + 3
    doc, code = source[:end], source[end:]
    for old, new in edits:
        assert code.count(old) == 1, (old, code.count(old))
        code = code.replace(old, new)
    path = Path.cwd() / f"{new_name}.py"
    path.write_text(doc + code)
    return path


def marker(path: Path, name: str) -> int:
    hits = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith(f"# <{name}>")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def at(path: Path, name: str) -> str:
    return f"{path.name}:{marker(path, name)}"


def run_plain(path: Path) -> dict[str, torch.Tensor]:
    return runpy.run_path(str(path), run_name="__main__")["result"]


def diagnose(path: Path, **options: Any) -> list[ipd.Finding]:
    """The findings (info left out) of a run under watch(); the program may stop at its error."""
    session = ipd.watch(**options)
    try:
        with session:
            runpy.run_path(str(path), run_name="__main__")
    except RuntimeError:
        pass
    return [f for f in session.report().findings if f.severity is not Severity.INFO]


def describe(findings: list[ipd.Finding]) -> str:
    return "\n".join(
        f"{f.code} {f.severity} write={f.mutation.location} saved={f.saved.location if f.saved else None}"
        f" fixes={[(str(x.kind), len(x.edits)) for x in f.fixes]}\n  fix: {f.fix}"
        for f in findings
    ) or "no findings"


def naming(findings: list[ipd.Finding], code: str, severity: Severity, write: str, saved: str) -> ipd.Finding:
    hits = [
        f for f in findings
        if f.code == code and f.severity is severity and f.mutation.location == write
        and f.saved is not None and f.saved.location == saved
    ]
    assert hits, f"no {code} {severity} naming {write} and {saved}:\n{describe(findings)}"
    return hits[0]


def apply(*fixes: Fix) -> None:
    """Write the fixes' edits into their files, as `inplace-doctor fix` does."""
    edits = [e for fix in fixes for e in fix.edits]
    assert edits, fixes
    write_all(plan(edits, str(Path.cwd())))


def edited(finding: ipd.Finding, kind: FixKind | None = None) -> Fix:
    """The finding's first fix that carries edits (of `kind`, when given)."""
    fix = next((f for f in finding.fixes if f.edits and kind in (None, f.kind)), None)
    assert fix is not None, finding.fixes
    return fix


def insert_after(path: Path, line: int, statement: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    target = lines[line - 1]
    indent = target[: len(target) - len(target.lstrip())]
    lines.insert(line, f"{indent}{statement}\n")
    path.write_text("".join(lines))


def assert_same(fixed: dict[str, torch.Tensor], intended: dict[str, torch.Tensor]) -> None:
    assert fixed.keys() == intended.keys()
    differ = [k for k in fixed if not torch.equal(fixed[k], intended[k])]
    assert not differ, differ


def check_fixed(path: Path, intended: Path) -> None:
    assert diagnose(path) == [], path.read_text()
    assert_same(run_plain(path), run_plain(intended))


# -- which rule, which lines, under both tracers -----------------------------------------------------

# name -> [(code, severity, write marker, saved marker)]: every finding the report must hold
EXPECTED = {
    # https://github.com/pytorch/pytorch/issues/9391
    "sigmoid_index_assign": [("IPD101", Severity.ERROR, "write", "saved")],
    # https://github.com/pytorch/pytorch/pull/5842
    "boltzmann_transform": [("IPD101", Severity.ERROR, "write", "saved")],
    # https://github.com/adambielski/siamese-triplet/issues/51: `pow` saved its input on the same line
    "siamese_l2_embedding": [("IPD101", Severity.ERROR, "write", "write")],
    # https://github.com/pytorch/pytorch/issues/1321: the product saved the quadrant it is written into
    "quadrant_scale_assign": [("IPD101", Severity.ERROR, "write", "write")],
    # https://github.com/open-mmlab/mmocr/pull/884: backward reaches c5 first; c2..c4 the same bug, unconfirmed
    "mmocr_fpem_ffm": [
        ("IPD101", Severity.ERROR, "write-c5", "saved"),
        *[("IPD101", Severity.WARNING, f"write-c{i}", "saved") for i in (2, 3, 4)],
    ],
    # https://github.com/pytorch/pytorch/issues/26596: Embedding.forward's embedding_renorm_
    "embedding_max_norm": [("IPD101", Severity.ERROR, "write", "saved")],
    # https://github.com/rail-berkeley/rlkit/pull/109: qf2's step raised first; qf1's the same bug
    "sac_critic_before_actor": [
        ("IPD101", Severity.ERROR, "write-qf2", "saved"),
        ("IPD101", Severity.WARNING, "write-qf1", "saved"),
    ],
    # https://github.com/ClownW/Reinforcement-learning-with-PyTorch/issues/1
    "ac_cartpole_td_error": [("IPD101", Severity.ERROR, "write", "saved")],
    # https://github.com/vikrant7/mobile-vod-bottleneck-lstm/issues/25
    "lstm_hidden_not_detached": [("IPD101", Severity.ERROR, "write", "saved")],
    # https://github.com/pytorch/pytorch/issues/39141
    "gan_sine_step_order": [("IPD101", Severity.ERROR, "write", "saved")],
    # https://github.com/dreamgonfly/GAN-tutorial/issues/1: both modules run inside `self.main(inputs)`
    "gan_leaky_dropout_inplace": [("IPD101", Severity.ERROR, "write", "write")],
    # https://github.com/sniklaus/softmax-splatting/issues/50: a custom Function's save, at its
    # `self.save_for_backward(...)` line
    "softsplat_saved_input": [("IPD101", Severity.ERROR, "write", "saved")],
}


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_names_both_lines(name, deep):
    path = program(name)
    findings = diagnose(path, deep=deep)
    for code, severity, write, saved in EXPECTED[name]:
        finding = naming(findings, code, severity, at(path, write), at(path, saved))
        assert finding.confirmed is (severity is Severity.ERROR), describe(findings)
    assert len(findings) == len(EXPECTED[name]), describe(findings)


def test_the_saving_call_is_on_the_saved_sites_stack():
    """A save inside a helper module (SAC's ConcatMlp, the critic's net, the LSTM module) names the
    innermost user line, and keeps the caller's line that ran the forward on its stack."""
    for name, caller in (
        ("sac_critic_before_actor", "saved-call"),
        ("ac_cartpole_td_error", "saved-call"),
        ("lstm_hidden_not_detached", "forward"),
    ):
        path = program(name)
        [error] = [f for f in diagnose(path) if f.severity is Severity.ERROR]
        assert error.saved is not None and marker(path, caller) in [f.line for f in error.saved.stack], (name, error.saved.stack)


# -- the fixes -------------------------------------------------------------------------------------------


def test_sigmoid_index_assign_fix_equals_setting_the_element_out_of_place():
    path = program("sigmoid_index_assign")
    [finding] = diagnose(path)
    fix = edited(finding)
    assert fix.kind is FixKind.CLONE_BEFORE_WRITE
    apply(fix)
    intended = derived(
        "sigmoid_index_assign", "intended", ("b[1] = 2  # <write>", "b = torch.where(torch.arange(3) == 1, torch.tensor(2.), b)")
    )
    check_fixed(path, intended)


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("boltzmann_transform", "probs /= probs.sum(-1, True)", "probs = probs / probs.sum(-1, True)"),
        (
            "siamese_l2_embedding",
            "output /= output.pow(2).sum(1, keepdim=True).sqrt()",
            "output = output / output.pow(2).sum(1, keepdim=True).sqrt()",
        ),
    ],
)
def test_an_augmented_division_fix_equals_the_upstream_division(name, old, new):
    path = program(name)
    [finding] = diagnose(path)
    fix = edited(finding)
    assert fix.kind is FixKind.OUT_OF_PLACE
    apply(fix)
    check_fixed(path, derived(name, "intended", (old, new)))


def test_quadrant_scale_fix_equals_scaling_the_quadrant_out_of_place():
    """The statement both computes from the quadrant and writes it: the fix computes first, copies,
    then writes; the intended program assembles the map with `torch.cat`."""
    path = program("quadrant_scale_assign")
    [finding] = diagnose(path)
    fix = edited(finding)
    assert fix.kind is FixKind.COMPUTE_THEN_WRITE
    apply(fix)
    intended = derived(
        "quadrant_scale_assign",
        "intended",
        (
            "x11[:, :, 0:int(w_f/2), 0:int(h_f/2)] = x11[:, :, 0:int(w_f/2), 0:int(h_f/2)] * xx1[0]  # <write>",
            "w, h = int(w_f/2), int(h_f/2)\n"
            "x11 = torch.cat((torch.cat((x11[:, :, :w, :h] * xx1[0], x11[:, :, :w, h:]), 3), x11[:, :, w:]), 2)",
        ),
    )
    check_fixed(path, intended)
    assert not torch.equal(run_plain(path)["loss"], run_plain(derived("quadrant_scale_assign", "whole", (
        "x11[:, :, 0:int(w_f/2), 0:int(h_f/2)] = x11[:, :, 0:int(w_f/2), 0:int(h_f/2)] * xx1[0]  # <write>",
        "x11 = x11 * xx1[0]",
    )))["loss"])  # the thread's `x11 = x11 * xx1[0]` means something else


def test_mmocr_fix_equals_the_upstream_fix():
    path = program("mmocr_fpem_ffm")
    findings = diagnose(path)
    fixes = [edited(f) for f in findings]
    assert {f.kind for f in fixes} == {FixKind.OUT_OF_PLACE} and len(fixes) == 4
    apply(*fixes)
    intended = derived("mmocr_fpem_ffm", "intended", *[(f"c{i}_ffm += c{i}", f"c{i}_ffm = c{i}_ffm + c{i}") for i in (2, 3, 4, 5)])
    check_fixed(path, intended)


def test_embedding_max_norm_fix_recomputes_the_saving_forward_and_never_moves_the_lookup():
    """The update is `embedding(idx)`'s own renormalization, on a line whose result (`b`) the forward
    uses before the backward: no move of that line (the program would lose `b`). The fix left,
    "run the forward that the backward uses again after the update", applied literally (the saving
    line again after the lookup), is the reporter's "swapping Line a and Line b"."""
    path = program("embedding_max_norm")
    [finding] = diagnose(path)
    assert [f.kind for f in finding.fixes] == [FixKind.RECOMPUTE], describe([finding])
    assert f"uses again after the update of `embedding.weight` at {at(path, 'write')}" in finding.fix
    assert "move" not in finding.fix
    insert_after(path, marker(path, "write"), "a = embedding.weight @ W.t()")
    swapped = derived(
        "embedding_max_norm",
        "swapped",
        ("a = embedding.weight @ W.t()  # <saved>\nb = embedding(idx) @ W.t()  # <write>",
         "b = embedding(idx) @ W.t()\na = embedding.weight @ W.t()"),
    )
    check_fixed(path, swapped)


def test_sac_fix_moves_both_q_steps_after_the_policy_backward_restricted_to_the_policy():
    """The error's move (edits) and the warning's (prose, "after the later backward"), with the
    restriction the fix asks for (`policy_loss.backward(inputs=...)`), give the PR's program, which
    updates the policy first. Moved without the restriction, the policy loss's gradient reaches the
    Q functions' `.grad` and their steps apply it: the fix's caution is true."""
    path = program("sac_critic_before_actor")
    findings = diagnose(path)
    error = naming(findings, "IPD101", Severity.ERROR, at(path, "write-qf2"), at(path, "saved"))
    warning = naming(findings, "IPD101", Severity.WARNING, at(path, "write-qf1"), at(path, "saved"))
    move = edited(error, FixKind.MOVE_STATEMENT)
    assert edited(error).kind is FixKind.UPDATE_FIRST  # tried first: the policy's update before the Q steps
    assert [e.old.split("#")[0].strip() for e in move.edits] == ["self.qf2_optimizer.step()", ""]
    assert f"move `Adam.step` at {at(path, 'write-qf1')} after the later backward and restrict" in warning.fix
    assert "(`loss.backward(inputs=[...])`)" in error.fix
    backward, qf1 = marker(path, "backward"), marker(path, "write-qf1")
    apply(move)  # qf2's step deleted above, inserted after the backward: line numbers above it stand
    insert_after(path, backward - 1, "self.qf1_optimizer.step()")  # qf2's deletion moved the backward up
    lines = path.read_text().splitlines(keepends=True)
    assert lines[qf1 - 1].strip() == "self.qf1_optimizer.step()  # <write-qf1>"
    del lines[qf1 - 1]
    path.write_text("".join(lines))
    unrestricted = path.read_text()
    restricted = unrestricted.replace(
        "policy_loss.backward()  # <backward>", "policy_loss.backward(inputs=list(self.policy.parameters()))"
    )
    assert restricted != unrestricted
    path.write_text(restricted)
    policy_block = (
        "        self.policy_optimizer.zero_grad()\n"
        "        policy_loss.backward()  # <backward>\n"
        "        self.policy_optimizer.step()\n"
    )
    intended = derived(
        "sac_critic_before_actor",
        "intended",
        (policy_block, ""),
        ('        """\n        Update networks\n        """\n', '        """\n        Update networks\n        """\n' + policy_block),
    )
    check_fixed(path, intended)
    moved_alone = Path("moved_alone.py")
    moved_alone.write_text(unrestricted)
    assert run_plain(moved_alone).keys() == run_plain(intended).keys()
    assert not torch.equal(run_plain(moved_alone)["qf2.net.2.weight"], run_plain(intended)["qf2.net.2.weight"])


GAN_INTENDED = (
    """    prob_artist0 = D(artist_paintings)
    prob_artist1 = D(G_paintings)  # <saved>

    D_loss = - torch.mean(torch.log(prob_artist0) + torch.log(1. - prob_artist1))
    G_loss = torch.mean(torch.log(1. - prob_artist1))

    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()  # <write>

    opt_G.zero_grad()
    G_loss.backward()  # <backward>
    opt_G.step()
""",
    """    prob_artist1 = D(G_paintings)
    G_loss = torch.mean(torch.log(1. - prob_artist1))
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()

    prob_artist0 = D(artist_paintings)
    prob_artist1 = D(G_paintings.detach())
    D_loss = - torch.mean(torch.log(prob_artist0) + torch.log(1. - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()
""",
)


def test_gan_sine_fix_moves_the_d_step_and_restricts_g_backward_to_g():
    """The move (edits) with the restriction the fix asks for (`G_loss.backward(inputs=...)`) trains
    as the tutorial's later form (G first, then D on `G_paintings.detach()`); moved alone, G's loss
    reaches D's `.grad` and D's step applies it: the caution is true."""
    path = program("gan_sine_step_order")
    [finding] = diagnose(path)
    move = edited(finding, FixKind.MOVE_STATEMENT)
    assert "accumulates into D's `.grad`" in finding.fix
    apply(move)
    unrestricted = path.read_text()
    restricted = unrestricted.replace("G_loss.backward()  # <backward>", "G_loss.backward(inputs=list(G.parameters()))")
    assert restricted != unrestricted
    path.write_text(restricted)
    intended = derived("gan_sine_step_order", "intended", GAN_INTENDED)
    check_fixed(path, intended)
    moved_alone = Path("moved_alone.py")
    moved_alone.write_text(unrestricted)
    assert not torch.equal(run_plain(moved_alone)["D.0.weight"], run_plain(intended)["D.0.weight"])


def test_gan_leaky_dropout_fix_turns_the_dropout_flag_off_as_the_answer_does():
    """The fix turns off the writer's flag (Dropout's); the answer in the thread turns off both. The
    in-place LeakyReLU on a Linear output is harmless (Linear saved its input), so both compute alike."""
    path = program("gan_leaky_dropout_inplace")
    [finding] = diagnose(path)
    fix = edited(finding)
    assert fix.kind is FixKind.FLAG_OFF_AT_CONSTRUCTOR and fix.edits[0].start.line == marker(path, "origin")
    apply(fix)
    intended = derived(
        "gan_leaky_dropout_inplace",
        "intended",
        ("nn.LeakyReLU(0.2, inplace=True)", "nn.LeakyReLU(0.2)"),
        ("nn.Dropout(inplace=True),  # <origin>", "nn.Dropout(),"),
    )
    check_fixed(path, intended)


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_softsplat_names_the_save_for_backward_line(deep):
    """autograd packs a custom Function's saves when `apply` returns (the stack shows the `apply`
    call alone); the saved site names the `self.save_for_backward(...)` line the reporter changed,
    with the `apply` call above it on its stack."""
    path = program("softsplat_saved_input")
    finding = naming(diagnose(path, deep=deep), "IPD101", Severity.ERROR, at(path, "write"), at(path, "saved"))
    assert finding.saved is not None and [f.line for f in finding.saved.stack][-2:] == [marker(path, "apply"), marker(path, "saved")]


def test_reading_a_custom_functions_save_line_keeps_none_of_the_program_alive():
    """The save line is read once per `forward` and remembered by its code object: the script's
    namespace (its model, its tensors) is not kept once the run is over."""
    path = Path("saves.py")
    path.write_text(
        "import torch\n"
        "class Twice(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        ctx.save_for_backward(x)\n"
        "        return x * 2\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        return g * 2\n"
        "big = torch.randn(64, requires_grad=True)\n"
        "Twice.apply(big * 1).sum().backward()\n"
    )
    with ipd.watch():
        namespace = runpy.run_path(str(path), run_name="__main__")
    alive = weakref.ref(namespace["big"])
    del namespace
    gc.collect()
    assert alive() is None


def test_softsplat_fix_turns_the_in_place_relu_off():
    path = program("softsplat_saved_input")
    [finding] = diagnose(path)
    fix = edited(finding)
    assert fix.kind is FixKind.FLAG_OFF_AT_CONSTRUCTOR and fix.edits[0].start.line == marker(path, "origin")
    apply(fix)
    intended = derived("softsplat_saved_input", "intended", ("nn.ReLU(inplace=True), nn.Conv2d(4, 4", "nn.ReLU(), nn.Conv2d(4, 4"))
    check_fixed(path, intended)


def test_ac_cartpole_move_across_functions_carries_no_edits():
    """The critic's step is in `Critic.learn`, the backward in `Actor.learn`: a statement moved
    from one method into the other would step the actor's optimizer (`self` is another object)."""
    path = program("ac_cartpole_td_error")
    [finding] = diagnose(path)
    assert all(not f.edits for f in finding.fixes), describe([finding])
    assert f"the backward at {at(path, 'backward')}" in finding.fix


@pytest.mark.xfail(
    strict=True,
    reason="the intended fix (the TensorFlow original feeds td_error to the actor as a constant) is "
    "`td.detach()` where the actor's loss uses it; the printed fixes are to recompute the critic's forward "
    "after its step (other td values) or to move the critic's step after the actor's backward (across "
    "methods, and the actor's loss would train the critic); the tool does not yet say 'if that backward "
    "is not meant to reach the stepped parameters, detach where it enters their graph'",
)
def test_ac_cartpole_fix_detaches_the_td_error_the_actor_uses():
    path = program("ac_cartpole_td_error")
    [finding] = diagnose(path)
    assert "detach" in finding.fix, finding.fix


def test_lstm_state_carried_across_steps_fix_detaches_it_after_the_step():
    """The backward (:46) is above the step (:47) in the loop: moving the step after it changes
    nothing, and the forward that saved runs inside the loop (a new graph each frame) but reaches the
    earlier frame's graph through `net.hidden`. The fix: detach what the loop carries after the step;
    applied literally to the carried state, it is the thread's fix (detach_hidden in the inner loop)."""
    path = program("lstm_hidden_not_detached")
    [finding] = diagnose(path)
    assert [f.kind for f in finding.fixes] == [FixKind.DETACH_CARRIED], describe([finding])
    assert f"the backward at {at(path, 'backward')} runs again in a later iteration" in finding.fix
    assert "detach that tensor after the step" in finding.fix and "move" not in finding.fix.split(";")[0]
    insert_after(path, marker(path, "write"), "net.hidden = tuple(h.detach() for h in net.hidden)")
    intended = derived(
        "lstm_hidden_not_detached",
        "intended",
        ("        running_loss += loss.item()\n    net.detach_hidden()  # <detach>\n",
         "        running_loss += loss.item()\n        net.detach_hidden()\n"),
    )
    check_fixed(path, intended)


def test_a_graph_made_before_the_loop_is_recomputed_not_detached():
    """The same shape as the LSTM loop, but the forward that saved ran before the loop (SinGAN's
    `fake`, tests/real_code/test_bug_reports.py section 7): the fix is to run it again inside the
    loop; detaching would cut the generator's gradient."""
    path = Path("reused_fake.py")
    path.write_text(
        "import torch\n"
        "from torch import nn\n"
        "torch.manual_seed(0)\n"
        "g, d = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)), nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(g.parameters(), lr=0.1)\n"
        "fake = g(torch.randn(2, 3))  # <saved>\n"
        "for step in range(2):\n"
        "    opt.zero_grad()\n"
        "    d(fake).mean().backward(retain_graph=True)  # <backward>\n"
        "    opt.step()  # <write>\n"
    )
    [finding] = diagnose(path)
    assert finding.saved is not None and finding.saved.location == at(path, "saved")
    assert [f.kind for f in finding.fixes] == [FixKind.RECOMPUTE], describe([finding])
    assert f"run the forward that the backward at {at(path, 'backward')} uses again after `SGD.step`" in finding.fix
