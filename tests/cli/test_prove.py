"""The proof of a fix on the user's own program: edits made in a scratch copy, the run compared bit
for bit with the reference run (the original program, every saved tensor copied at save)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

from inplace_doctor.cli.prove import Verdict, Workspace, identity, judge, serious
from inplace_doctor.cli.source_edits import plan
from inplace_doctor.findings import Edit, Position
from programs import ACTOR_CRITIC_SLOTS as ACTOR_CRITIC
from programs import POLYAK
from programs import BUFFER_STEPS as BUFFER


def prove(tmp_path: Path, source: str, edits: list[Edit]) -> tuple[Workspace, Verdict, list[dict[str, Any]]]:
    """(the workspace, the verdict of the edited program against the reference, its findings)."""
    (tmp_path / "train.py").write_text(source)
    ws = Workspace(str(tmp_path), "train.py", [], None)
    try:
        original = ws.run({})
        findings = serious(original.findings)
        assert findings, original.stderr
        reference = ws.run({}, reference=True)
        assert reference.record is not None and reference.record.ended == "ran to the end", reference.stderr
        state = {p: after for p, (_, after) in plan(edits, str(tmp_path)).items()}
        trial = ws.run(state)
        known = {identity(f, original.tree) for f in findings}
        verdict = judge(identity(findings[0], original.tree), trial, reference.record, known)
    finally:
        ws.close()
    assert not os.path.exists(ws.tmp)
    return ws, verdict, trial.findings


def insert(line: int, indent: int, text: str) -> Edit:
    return Edit("train.py", Position(line, indent), Position(line, indent), "", text + "\n" + " " * indent)




def test_a_clone_before_a_write_that_saves_its_own_operands_is_not_proven(tmp_path: Path) -> None:
    # issue 23, item 2: the clone is both read and written, so the finding stays
    _, verdict, findings = prove(tmp_path, BUFFER, [insert(9, 4, "buf = buf.clone()")])
    assert not verdict.gone and not verdict.proven
    assert [f["code"] for f in serious(findings)] == ["IPD101"]


def test_computing_the_value_then_writing_into_a_copy_is_proven_bit_for_bit(tmp_path: Path) -> None:
    write = Edit("train.py", Position(9, 4), Position(9, 38), "buf[4] = torch.mul(buf[2], buf[3])",
                 "v = torch.mul(buf[2], buf[3])\n    buf = buf.clone()\n    buf[4] = v")
    _, verdict, findings = prove(tmp_path, BUFFER, [write])
    assert verdict.proven, verdict
    assert verdict.steps == 3 and not serious(findings)


def move_step(after_line: int) -> list[Edit]:
    """Delete `c_opt.step()` (line 20) and insert it after the actor's backward."""
    return [
        Edit("train.py", Position(20, 0), Position(21, 0), "    c_opt.step()  # overwrites it before the actor's backward\n", ""),
        insert(after_line + 1, 4, "c_opt.step()"),
    ]


def test_moving_the_step_past_code_that_reads_the_stepped_parameters_is_not_proven(tmp_path: Path) -> None:
    # issue 23, item 3: the Polyak update between the step and the backward reads other values
    source = ACTOR_CRITIC.replace("POLYAK_HERE\n", POLYAK + "\n").replace("POLYAK_LAST\n", "")
    _, verdict, findings = prove(tmp_path, source, move_step(24))
    assert verdict.gone and not verdict.new and verdict.comparison == "differs", verdict
    assert not verdict.proven and "differs from the intended program's" in verdict.first_difference
    assert not serious(findings)


def test_moving_the_step_past_the_backward_alone_is_proven(tmp_path: Path) -> None:
    source = ACTOR_CRITIC.replace("POLYAK_HERE\n", "").replace("POLYAK_LAST\n", POLYAK + "\n")
    _, verdict, _ = prove(tmp_path, source, move_step(21))
    assert verdict.proven, verdict


TWO_WRITES = textwrap.dedent(
    """\
    import torch

    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        h = torch.sigmoid(torch.randn(3, 4) @ w)
        h[0] = 0
        h[1] = 0
        (h * h).sum().backward()
        opt.step()
    """
)


def test_of_two_writes_to_one_saved_tensor_changing_the_first_is_enough(tmp_path: Path) -> None:
    # issue 23, item 4: one fix for one write; the other write's finding goes with it
    _, verdict, findings = prove(tmp_path, TWO_WRITES, [insert(9, 4, "h = h.clone()")])
    assert verdict.proven, verdict
    assert not serious(findings)
