"""Real in-place bug reports, reproduced as their authors wrote them, diagnosed and fixed by the tool.

Each program under tests/real_code/bug_reports/ is the code of one public report (the URL is in
its docstring), cut down to a few layers and one or two steps, and ends by binding `result`: the
losses, outputs and gradients (or parameters after the steps) it computed. Every report has two
tests:

- `..._names_both_lines`: the program runs under `ipd.watch()` (one under `python -m
  inplace_doctor run`), and the expected rule must fire naming both lines, `file:line`: the line that
  overwrote the tensor and the line that saved it for backward (IPD101/IPD104), read it afterwards
  (IPD105), or produced the views PyTorch refuses to let it write (IPD103).
- `..._fix_...`: the printed `fix` is applied to a copy of the program as printed (the edit the fix
  names, at the line it names, as tests/rules/test_fixes.py does; a prose fix is applied in its most
  literal reading, which the test spells out), the fixed program must raise nothing, draw no
  finding, and compute bit for bit what the intended out-of-place program (the upstream fix, or the
  one the report's thread proposes) computes.

Where the tool misses, names a wrong line, or prints a fix that does not run or changes the meaning,
the test is kept and marked xfail(strict=True) with what went wrong.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.rules import FAST_MODE_RULES

PROGRAMS = Path(__file__).resolve().parent / "bug_reports"

# The fix templates, as tests/rules/test_fixes.py parses them (copied, not imported).
REPLACE = re.compile(r"replace `(?P<old>.+?)` with `(?P<new>.+?)` at (?P<file>[^\s:`]+):(?P<line>\d+)")
INSERT = re.compile(r"insert `(?P<new>.+?)` before `(?P<old>.+?)` at (?P<file>[^\s:`]+):(?P<line>\d+)")
CONSTRUCT = re.compile(r"construct `(?P<ref>.+?)` with inplace=False at (?P<file>[^\s:`]+):(?P<line>\d+)")
COPY = re.compile(r"write into a copy \(`(?P<new>.+?)` before `(?P<old>.+?)`\).* at (?P<file>[^\s:`]+):(?P<line>\d+)")
# IPD103's prose fix for a multi-output view; no line of its own: applied at the finding's line.
CLONE_PIECE = "`.clone()` the piece before modifying it"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # printed locations are then the bare file names
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- helpers (after tests/rules/test_fixes.py) ----------------------------------------------------


def program(name: str) -> Path:
    """A fresh copy of bug_reports/<name>.py in the working directory."""
    path = Path.cwd() / f"{name}.py"
    shutil.copyfile(PROGRAMS / f"{name}.py", path)
    return path


def derived(name: str, new_name: str, *edits: tuple[str, str]) -> Path:
    """bug_reports/<name>.py with each (old, new) replaced in its code (not its docstring, where old
    must occur exactly once), as <new_name>.py."""
    source = (PROGRAMS / f"{name}.py").read_text()
    end = source.index('"""', 3) + 3  # the module docstring, which quotes the buggy lines, stays as is
    doc, code = source[:end], source[end:]
    for old, new in edits:
        assert code.count(old) == 1, (old, code.count(old))
        code = code.replace(old, new)
    path = Path.cwd() / f"{new_name}.py"
    path.write_text(doc + code)
    return path


def marker(path: Path, name: str) -> int:
    """The 1-based line of `path` ending with the comment `# <name>` (exactly one)."""
    hits = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith(f"# <{name}>")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def run_plain(path: Path) -> dict[str, torch.Tensor]:
    return runpy.run_path(str(path), run_name="__main__")["result"]


def diagnose(path: Path, **watch_options: Any) -> list[ipd.Finding]:
    """The findings (info left out) of a run of the program under watch(); it may stop at the error."""
    session = ipd.watch(**watch_options)
    try:
        with session:
            runpy.run_path(str(path), run_name="__main__")
    except RuntimeError:
        pass
    return [f for f in session.report().findings if f.severity is not Severity.INFO]


def describe(findings: list[ipd.Finding]) -> str:
    return "\n".join(
        f"{f.code} {f.severity} write={f.mutation.location} saved={f.saved.location if f.saved else None} "
        f"read={f.read.location if f.read else None}\n  fix: {f.fix}"
        for f in findings
    ) or "no findings"


def naming(findings: list[ipd.Finding], code: str, severity: Severity, write: str, other: str) -> ipd.Finding:
    """The `code` finding of `severity` whose overwriting site is `write` and whose saving (or
    reading) site is `other`, both `file:line`."""
    hits = [
        f
        for f in findings
        if f.code == code
        and f.severity is severity
        and f.mutation.location == write
        and any(site is not None and site.location == other for site in (f.saved, f.read))
    ]
    assert hits, f"no {code} {severity} naming {write} and {other}:\n{describe(findings)}"
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


def edit_of(finding: ipd.Finding, path: Path) -> tuple[str, int, str, str] | None:
    """The first edit the finding's printed fix names: (kind, line, old, new), or None for prose."""
    fix = finding.fix
    for kind, pattern in (("insert", INSERT), ("insert", COPY), ("replace", REPLACE)):
        m = pattern.search(fix)
        if m:
            assert Path(m["file"]).name == path.name, (m["file"], path)
            return kind, int(m["line"]), m["old"], m["new"]
    m = CONSTRUCT.search(fix)
    if m:
        assert Path(m["file"]).name == path.name, (m["file"], path)
        return "replace", int(m["line"]), "inplace=True", "inplace=False"
    if fix.startswith(CLONE_PIECE):  # at the write: `x.op_(` becomes `x.clone().op_(`
        code = path.read_text().splitlines()[finding.mutation.line - 1]
        m = re.search(r"\b(\w+)\.(\w+_)\(", code)
        assert m, code
        return "replace", finding.mutation.line, m[0], f"{m[1]}.clone().{m[2]}("
    return None


def apply_fixes(findings: list[ipd.Finding], path: Path) -> list[tuple[str, int, str, str]]:
    """Apply the edit each finding's fix names (each distinct edit once, bottom line first)."""
    edits = sorted({e for f in findings if (e := edit_of(f, path)) is not None}, key=lambda e: -e[1])
    assert edits, f"no printed fix names an edit:\n{describe(findings)}"
    for kind, line, old, new in edits:
        (insert_before if kind == "insert" else edit_line)(path, line, old, new)
    return edits


def assert_same(fixed: dict[str, torch.Tensor], intended: dict[str, torch.Tensor]) -> None:
    assert fixed.keys() == intended.keys()
    differ = [k for k in fixed if not torch.equal(fixed[k], intended[k])]
    assert not differ, differ


def check_fix(path: Path, findings: list[ipd.Finding], intended: Path) -> None:
    """Apply the printed fixes, then: no finding, no exception, and exactly the intended results."""
    apply_fixes(findings, path)
    assert diagnose(path) == [], path.read_text()
    assert_same(run_plain(path), run_plain(intended))


# -- 1. hidden state written in place in an RNN loop ------------------------------------------------
# https://github.com/pytorch/pytorch/issues/165621


def test_rnn_docstring_loop_names_both_lines():
    path = program("rnn_docstring")
    findings = diagnose(path)
    write, saved = f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'saved')}"
    finding = naming(findings, "IPD101", Severity.ERROR, write, saved)
    assert finding.confirmed is True
    assert edit_of(finding, path) is not None, finding.fix


def test_rnn_docstring_loop_fix_gives_the_list_based_forward_of_pr_173888():
    """The fix printed for the finding that names the write (the warning, see the xfail above): the
    matmul inside the writing statement saved a view of `h_t`, so the value is computed first, then
    written into a copy (`h_t = h_t.clone()` between the two), the record's edit, as every output
    prints it. It must equal PR #173888's list form."""
    path = program("rnn_docstring")
    findings = [f for f in diagnose(path) if f.code == "IPD101"]
    fix = " ".join(f.fix for f in findings)
    assert "compute the value first, then write it into a copy: replace `h_t[layer] = torch.tanh(" in fix, fix
    (edit,) = {e for f in findings for x in f.fixes for e in x.edits}
    assert [line.strip() for line in edit.new.splitlines()[-2:]] == ["h_t = h_t.clone()", "h_t[layer] = value"], edit.new
    text = path.read_text()
    assert text.count(edit.old) == 1
    path.write_text(text.replace(edit.old, edit.new))
    assert diagnose(path) == [], path.read_text()
    assert_same(run_plain(path), run_plain(PROGRAMS / "rnn_docstring_intended.py"))


# -- 2. `x /= x.norm()`: the norm saved its input --------------------------------------------------
# https://github.com/huggingface/transformers/issues/24525, PR #24529

OWL_INTENDED = (
    (
        "image_class_embeds /= torch.linalg.norm(image_class_embeds, dim=-1, keepdim=True) + 1e-6",
        "image_class_embeds = image_class_embeds / (torch.linalg.norm(image_class_embeds, dim=-1, keepdim=True) + 1e-6)",
    ),
    (
        "query_embeds /= torch.linalg.norm(query_embeds, dim=-1, keepdim=True) + 1e-6",
        "query_embeds = query_embeds / (torch.linalg.norm(query_embeds, dim=-1, keepdim=True) + 1e-6)",
    ),
)


def test_owlvit_normalize_names_both_lines():
    path = program("owlvit_normalize")
    findings = diagnose(path)
    # backward reaches the query norm first (the error); the image norm is the same bug, unconfirmed
    line = marker(path, "write-query")
    finding = naming(findings, "IPD101", Severity.ERROR, f"{path.name}:{line}", f"{path.name}:{line}")
    assert finding.saved.op.endswith("linalg_vector_norm") and finding.confirmed is True
    line = marker(path, "write-image")
    naming(findings, "IPD101", Severity.WARNING, f"{path.name}:{line}", f"{path.name}:{line}")


def test_owlvit_normalize_fix_divides_by_the_whole_right_hand_side():
    path = program("owlvit_normalize")
    findings = diagnose(path)
    check_fix(path, findings, derived("owlvit_normalize", "intended", *OWL_INTENDED))


# -- 3. in-place writes into the views `for channel in tensor[0]` unbinds --------------------------
# https://github.com/haofanwang/Score-CAM/issues/28

SCORECAM_INTENDED = (
    (
        "    for channel, mean, std in zip(denormalized[0], means, stds):  # <views>\n"
        "        channel.mul_(std).add_(mean)  # <write>\n",
        "    count = 0\n"
        "    for channel, mean, std in zip(denormalized[0], means, stds):\n"
        "        denormalized[0][count] = denormalized[0][count].mul(std)\n"
        "        denormalized[0][count] = denormalized[0][count].add(mean)\n"
        "        count += 1\n",
    ),
)


def test_scorecam_denormalize_names_both_lines():
    path = program("scorecam_denormalize")
    findings = diagnose(path)
    naming(findings, "IPD103", Severity.ERROR, f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'views')}")


def test_scorecam_denormalize_fix_offers_the_write_by_index_and_warns_that_a_cloned_piece_loses_it():
    """The loop means to change `denormalized` channel by channel: of the two choices the fix
    names, the second (write into the tensor by index) is the thread's fix; the first (rebind the
    piece) would not change `denormalized`, and the fix says so. A clone of the piece, written,
    loses the write (what the old fix, "`.clone()` the piece", led to): it says that too."""
    path = program("scorecam_denormalize")
    [finding] = [f for f in diagnose(path) if f.code == "IPD103"]
    fix = finding.fix
    assert not fix.startswith(CLONE_PIECE)
    assert "the tensor it came from keeps its old values" in fix
    assert "write into that tensor by index, one piece at a time (`t[i] = t[i].op(...)`" in fix
    assert "Writing a `.clone()` of the piece changes neither: the write is lost" in fix
    # the chained write is not rewritten as one half in place: no `channel = channel.mul(std).add_(mean)`
    assert "channel = channel.mul(" not in fix


# -- 4. `clamp_` on a `chunk` output ---------------------------------------------------------------
# https://github.com/toshikwa/gail-airl-ppo.pytorch/issues/13


def test_gail_chunk_clamp_names_both_lines():
    path = program("gail_chunk_clamp")
    findings = diagnose(path)
    naming(findings, "IPD103", Severity.ERROR, f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'views')}")


def test_gail_chunk_clamp_fix_equals_the_reporters_clamp():
    """The fix's first choice, the piece alone (`log_stds` is not read again): `clamp` out of place
    where its result is used, which is the reporter's fix."""
    path = program("gail_chunk_clamp")
    findings = diagnose(path)
    assert [f.code for f in findings] == ["IPD103"]
    assert "Only this piece: use the out-of-place op where its result is used" in findings[0].fix
    check_fix(path, findings, derived("gail_chunk_clamp", "intended", ("log_stds.clamp_(-20, 2)", "log_stds.clamp(-20, 2)")))


# -- 5. `out += self.bias` after a scatter-max that saved its output (run from the command line) ---
# https://github.com/pyg-team/pytorch_geometric/issues/8953


def test_pyg_bias_after_max_aggregation_names_both_lines_from_the_command_line():
    path = program("pyg_bias_after_max_aggr")
    proc = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--format", "json", "--output", "report.json", path.name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "modified by an inplace operation" in proc.stderr  # the script's own traceback is kept
    report = json.loads(Path("report.json").read_text())
    hits = [
        f
        for f in report["findings"]
        if f["code"] == "IPD101"
        and f["severity"] == "error"
        and (Path(f["mutation"]["file"]).name, f["mutation"]["line"]) == (path.name, marker(path, "write"))
        and (Path(f["saved"]["file"]).name, f["saved"]["line"]) == (path.name, marker(path, "saved"))
    ]
    assert hits, json.dumps(report["findings"], indent=1)
    assert f"replace `out += self.bias` with `out = out + self.bias` at {path.name}:{marker(path, 'write')}" in hits[0]["fix"]


def test_pyg_bias_after_max_aggregation_fix_equals_the_upstream_fix():
    path = program("pyg_bias_after_max_aggr")
    findings = diagnose(path)
    check_fix(path, findings, derived("pyg_bias_after_max_aggr", "intended", ("out += self.bias", "out = out + self.bias")))


# -- 6. `logits += bias` in a loss helper, on the output of a sigmoid --------------------------------
# https://github.com/wutong16/DistributionBalancedLoss/issues/20


def test_dbloss_logit_reg_names_both_lines():
    path = program("dbloss_logit_reg")
    findings = diagnose(path)
    finding = naming(
        findings, "IPD101", Severity.ERROR, f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'saved')}"
    )
    assert finding.saved.op.endswith("sigmoid") and finding.saved.module == "model.1"


def test_dbloss_logit_reg_fix_computes_the_out_of_place_bias():
    """The fix keeps the helper's write and hands it a copy (`cls_score = cls_score.clone()` before the
    call); the intended program adds the bias out of place."""
    path = program("dbloss_logit_reg")
    findings = diagnose(path)
    intended = derived("dbloss_logit_reg", "intended", ("logits += self.neg_bias", "logits = logits + self.neg_bias"))
    check_fix(path, findings, intended)


# -- 7. the generator's step before a second backward through the same `fake` -----------------------
# https://github.com/tamarott/SinGAN/issues/148


def test_singan_generator_steps_names_both_lines():
    path = program("singan_generator_steps")
    findings = diagnose(path)
    finding = naming(
        findings, "IPD101", Severity.ERROR, f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'saved')}"
    )
    assert finding.mutation.api == "Adam.step" and finding.confirmed is True
    assert finding.places and all(p.startswith("netG.") for p in finding.places), finding.places


def test_singan_generator_steps_reports_only_the_generator_step():
    """Besides the error, `optimizerD.step()` (:36) overwrote the weights `output = netD(real)` (:27)
    saved, a graph `errD_real` merely keeps alive: not in the graph of errG's backward that raised, so
    it is info ('no backward reached this tensor while watch() was active'), not a warning that
    'backward stopped at an earlier in-place error before reaching this tensor' with the fix 'move
    `Adam.step` after the later backward' (there is none): the fixed program shows that graph harmless."""
    path = program("singan_generator_steps")
    findings = diagnose(path)
    assert [(f.code, f.mutation.location) for f in findings] == [("IPD101", f"{path.name}:{marker(path, 'write')}")], describe(findings)


def test_singan_generator_steps_fix_regenerates_fake_in_the_generator_loop():
    """The fix is prose: 'run the forward that the backward at :BACKWARD uses again after `Adam.step` at
    :STEP'. The forward of that backward that the loop does not re-run is `fake = netG(noise.detach())`;
    applied literally, it runs again at the top of the generator loop (after the previous step), which is
    rgb000000's fix in SinGAN PR #117 ("create a new fake here")."""
    path = program("singan_generator_steps")
    finding = naming(
        diagnose(path),
        "IPD101",
        Severity.ERROR,
        f"{path.name}:{marker(path, 'write')}",
        f"{path.name}:{marker(path, 'saved')}",
    )
    assert (
        f"run the forward that the backward at {path.name}:{marker(path, 'backward')} uses again after "
        f"`Adam.step` at {path.name}:{marker(path, 'write')}" in finding.fix
    ), finding.fix
    insert_before(path, marker(path, "regenerate-before"), "output = netD(fake)", "fake = netG(noise.detach())")
    assert diagnose(path) == [], path.read_text()
    intended = derived(
        "singan_generator_steps",
        "intended",
        ("        output = netD(fake)  # <regenerate-before>", "        # create a new fake here\n        fake = netG(noise.detach())\n        output = netD(fake)"),
    )
    assert_same(run_plain(path), run_plain(intended))


# -- 8. an in-place ReLU first in a residual branch, then `out += input`: silently wrong ------------
# https://github.com/rosinality/vq-vae-2-pytorch/issues/60


def test_vqvae_resblock_names_both_lines():
    path = program("vqvae_resblock")
    findings = diagnose(path)
    finding = naming(
        findings, "IPD105", Severity.ERROR, f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'read')}"
    )
    assert finding.mutation.origin is not None and finding.mutation.origin.line == marker(path, "origin")
    assert set(finding.places) == {"enc.blocks.1.conv.0", "enc.blocks.2.conv.0"}, finding.places


def test_vqvae_resblock_fix_equals_the_upstream_fix():
    path = program("vqvae_resblock")
    findings = diagnose(path)
    intended = derived("vqvae_resblock", "intended", ("nn.ReLU(inplace=True),  # <origin>", "nn.ReLU(),"))
    check_fix(path, findings, intended)
    # the bug was silent: the unfixed program runs and computes something else
    assert not torch.equal(run_plain(program("vqvae_resblock"))["out"], run_plain(intended)["out"])


# -- 9. `masked_fill_` on the softmax output --------------------------------------------------------
# https://github.com/lucidrains/flamingo-pytorch/issues/10


def test_flamingo_zero_attention_names_both_lines():
    path = program("flamingo_zero_attention")
    findings = diagnose(path)
    finding = naming(
        findings, "IPD101", Severity.ERROR, f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'saved')}"
    )
    assert finding.saved.op.endswith("_softmax") and finding.confirmed is True


def test_flamingo_zero_attention_fix_equals_the_maintainers_fix():
    path = program("flamingo_zero_attention")
    findings = diagnose(path)
    intended = derived(
        "flamingo_zero_attention",
        "intended",
        ("attn.masked_fill_(text_without_media_mask, 0.)", "attn = attn.masked_fill(text_without_media_mask, 0.)"),
    )
    check_fix(path, findings, intended)


# -- 10. masking through `.data` before the softmax ------------------------------------------------
# https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/16
# The write bypasses autograd, but the -inf before the softmax makes the gradient reaching the masked
# positions exactly 0: the gradients are the out-of-place program's. IPD110's prediction is cleared
# at backward by that gradient (counted as harmless), so a correct program, like section 11.


def test_aiayn_data_mask_is_silent_and_computes_what_the_out_of_place_mask_does():
    path = program("aiayn_data_mask")
    session = ipd.watch()
    with session:
        watched = runpy.run_path(str(path), run_name="__main__")["result"]
    assert session.report().findings == [] and session.report().stats["predictions_harmless"] == 1
    intended = derived(
        "aiayn_data_mask",
        "intended",
        ("attn.data.masked_fill_(attn_mask, -float('inf'))", "attn = attn.masked_fill(attn_mask, -float('inf'))"),
    )
    assert_same(watched, run_plain(intended))
    assert_same(run_plain(path), run_plain(intended))


# -- 11. a correct program with `exp_`/`add_`: nothing to report -----------------------------------
# https://github.com/pytorch/examples/issues/308


def test_vae_exp_inplace_is_clean_and_unchanged_by_watching():
    path = program("vae_exp_")
    assert diagnose(path) == []
    plain = run_plain(path)
    session = ipd.watch()
    with session:
        watched = runpy.run_path(str(path), run_name="__main__")["result"]
    assert_same(watched, plain)


# -- 12. `nn.RReLU` under non-reentrant checkpoint: the recompute stops before the noise is drawn --
# https://github.com/pytorch/pytorch/issues/193671


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "fast"])
def test_rrelu_checkpoint_names_both_lines(deep):
    path = program("rrelu_checkpoint")
    # the fast tracer (issue 26) with the rules it serves, IPD111 among them: per op inside regions
    findings = diagnose(path) if deep else diagnose(path, deep=False, select=sorted(FAST_MODE_RULES))
    write, call = f"{path.name}:{marker(path, 'write')}", f"{path.name}:{marker(path, 'checkpoint')}"
    finding = naming(findings, "IPD111", Severity.ERROR, write, write)  # the op saved and wrote `noise`
    assert [f.code for f in findings] == ["IPD111"], describe(findings)
    assert set(finding.places) == {"model.blocks.0.act", "model.blocks.1.act"}, finding.places
    assert f"checkpointed by `checkpoint` at {call}" in finding.what, finding.what
    assert f"pass early_stop=False to `checkpoint` at {call}" in finding.fix, finding.fix


def test_rrelu_checkpoint_fix_gives_the_unchecked_networks_gradients():
    """The fix is prose: 'pass early_stop=False to `checkpoint` at FILE:LINE', applied literally at
    that line. The fixed program draws no finding and trains exactly as the network without
    checkpointing does; the unfixed one trains to other weights with the same forward."""
    path = program("rrelu_checkpoint")
    [finding] = diagnose(path)
    edit_line(path, marker(path, "checkpoint"), "use_reentrant=False", "use_reentrant=False, early_stop=False")
    assert diagnose(path) == [], path.read_text()
    intended = derived(
        "rrelu_checkpoint",
        "intended",
        ("x = checkpoint(block, x, use_reentrant=False)  # <checkpoint>", "x = block(x)"),
    )
    assert_same(run_plain(path), run_plain(intended))
    assert not torch.equal(run_plain(program("rrelu_checkpoint"))["blocks.0.fc.weight"], run_plain(intended)["blocks.0.fc.weight"])


# -- 13. NumPy clips the probabilities sigmoid saved, through `.numpy()` ---------------------------
# https://github.com/pytorch/pytorch/issues/97586


def test_numpy_clip_saved_probs_audit_names_the_writing_line():
    """No op writes, so the first run sees only that the bytes changed; audit runs the model again,
    state restored, and names the NumPy line in the helper, with the forward line that called it."""
    path = program("numpy_clip_saved_probs")
    namespace = runpy.run_path(str(path), run_name="__main__")
    model, x = namespace["model"], namespace["x"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    rng, x_before = torch.get_rng_state(), x.clone()
    report = ipd.audit(model, x)
    [finding] = [f for f in report.findings if f.code == "IPD109"]
    assert finding.confirmed is True and finding.severity is Severity.ERROR
    assert (Path(finding.mutation.file).name, finding.mutation.line) == (path.name, marker(path, "write"))
    assert [(Path(f.file).name, f.line) for f in finding.mutation.stack] == [
        (path.name, marker(path, "handout")),
        (path.name, marker(path, "write")),
    ]
    assert (Path(finding.saved.file).name, finding.saved.line) == (path.name, marker(path, "saved"))
    assert finding.facts.handed_out == f"{path.name}:{marker(path, 'handout')}"
    # the second run left the model and the RNG as the caller had them
    assert all(torch.equal(p, before[n]) and torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(x, x_before)


def test_numpy_clip_saved_probs_under_watch_names_the_hand_out_and_says_the_line_was_not_looked_for():
    """watch() cannot run the program twice: the finding stands on the hand-out line, and says so."""
    path = program("numpy_clip_saved_probs")
    findings = [f for f in diagnose(path) if f.code == "IPD109"]
    assert findings and all(f.confirmed for f in findings)
    assert {(Path(f.mutation.file).name, f.mutation.line) for f in findings} == {(path.name, marker(path, "handout"))}
    assert all("not looked for" in f.what for f in findings)


def test_numpy_clip_saved_probs_run_check_contents_names_the_writing_line_in_both_steps():
    """`run --check-contents` checks the lines after each hand-out, in the user functions they call
    too: the NumPy line in the helper, in each step (not the step's `model(x)` line)."""
    path = program("numpy_clip_saved_probs")
    proc = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", "--check-contents", "--format", "json", "--output",
         "report.json", path.name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(Path("report.json").read_text())
    hits = [f for f in report["findings"] if f["code"] == "IPD109"]
    assert hits, json.dumps(report["findings"], indent=1)
    assert {(Path(f["mutation"]["file"]).name, f["mutation"]["line"]) for f in hits} == {(path.name, marker(path, "write"))}
    assert {(Path(f["saved"]["file"]).name, f["saved"]["line"]) for f in hits} == {(path.name, marker(path, "saved"))}


# -- 14. "best" weights kept as `model.state_dict()`: aliases that keep tracking the live weights ---
# https://github.com/pytorch/tutorials/pull/188

BEST_SNAPSHOT_FIX = ("best_model_wts = model.state_dict()  # <handout>", "best_model_wts = copy.deepcopy(model.state_dict())")
SAVED_NOT_LOADED = ("model.load_state_dict(best_model_wts)  # <read>", 'torch.save(best_model_wts, "best.pt")  # <read>')


def snapshot_sites(path: Path) -> tuple[str, str, str]:
    return tuple(f"{path.name}:{marker(path, name)}" for name in ("write", "read", "handout"))  # type: ignore[return-value]


@pytest.mark.parametrize("variant", ["load_state_dict", "torch.save"])
def test_transfer_best_weights_names_the_step_the_use_and_where_the_alias_was_taken(variant):
    """The tracking snapshot: a warning with the optimizer step that changed the weights (the write),
    the line that used the "snapshot" (the load, or `torch.save`, which reads storages without an
    op), and the line that took it (`handed_out`), as Site fields."""
    path = program("transfer_best_weights")
    if variant == "torch.save":
        path = derived("transfer_best_weights", "transfer_best_weights_saved", SAVED_NOT_LOADED)
    write, read, handout = snapshot_sites(path)
    findings = [f for f in diagnose(path) if f.code == "IPD107"]
    finding = naming(findings, "IPD107", Severity.WARNING, write, read)
    assert finding.mutation.op == "aten.add_" and finding.mutation.api == "SGD.step", finding.mutation
    assert finding.read.op == ("aten.copy_" if variant == "load_state_dict" else "torch.save"), finding.read
    assert finding.facts.handed_out == handout and finding.facts.held == "model.state_dict()['0.weight']"
    assert all(f.severity is Severity.WARNING and f.read.location == read for f in findings), describe(findings)


def test_transfer_best_weights_fix_restores_the_best_epoch_as_the_upstream_fix_does():
    path = program("transfer_best_weights")
    findings = [f for f in diagnose(path) if f.code == "IPD107"]
    (edit,) = {e for f in findings for fix in f.fixes for e in fix.edits}
    assert (edit.start.line, edit.old, edit.new) == (
        marker(path, "handout"), "model.state_dict()", "copy.deepcopy(model.state_dict())"
    )
    edit_line(path, edit.start.line, edit.old, edit.new)
    assert diagnose(path) == [], path.read_text()
    intended = derived("transfer_best_weights", "intended", BEST_SNAPSHOT_FIX)
    assert_same(run_plain(path), run_plain(intended))
    assert not torch.equal(run_plain(intended)["5.weight"], run_plain(PROGRAMS / "transfer_best_weights.py")["5.weight"])
