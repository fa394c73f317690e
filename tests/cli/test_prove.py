"""The proof of a fix on the user's own program: edits made in a scratch copy, the run compared bit
for bit with the reference run (the original program, every saved tensor copied at save)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from programs import ACTOR_CRITIC_SLOTS as ACTOR_CRITIC
from programs import BUFFER_STEPS as BUFFER
from programs import POLYAK

from inplace_doctor.cli.proof.edited_lines import origins
from inplace_doctor.cli.proof.prove import Verdict, Workspace, identity, judge, serious
from inplace_doctor.cli.proof.source_edits import plan
from inplace_doctor.findings import Edit, Finding, Position


class Proving:
    """A workspace on `source` (in `folder`) whose original and reference runs are done once, for
    trials of several sets of edits against them."""

    def __init__(self, folder: Path, source: str) -> None:
        (folder / "train.py").write_text(source)
        self.folder = folder
        self.ws = Workspace(str(folder), "train.py", [], None)
        try:
            self.original = self.ws.run({})
            self.findings = serious(self.original.findings)
            assert self.findings, self.original.stderr
            self.reference = self.ws.run({}, reference=True)
            assert self.reference.record is not None and self.reference.record.ended == "ran to the end", (
                self.reference.stderr)
        except BaseException:
            self.close()
            raise

    def trial(self, edits: list[Edit]) -> tuple[Verdict, list[Finding]]:
        """(the verdict of the edited program against the reference, its findings)."""
        state = {p: after for p, (_, after) in plan(edits, str(self.folder)).items()}
        trial = self.ws.run(state)
        assert self.reference.record is not None
        known = {identity(f, self.original.tree) for f in self.findings}
        lines = origins(state, self.ws.original, self.ws.root)  # the trial's lines, followed back through the edits
        target = identity(self.findings[0], self.original.tree)
        return judge(target, trial, self.reference.record, known, lines=lines), trial.findings

    def close(self) -> None:
        self.ws.close()
        assert not os.path.exists(self.ws.tmp)


def prove(tmp_path: Path, source: str, edits: list[Edit]) -> tuple[Verdict, list[dict[str, Any]]]:
    """(the verdict of the edited program against the reference, its findings)."""
    proving = Proving(tmp_path, source)
    try:
        return proving.trial(edits)
    finally:
        proving.close()


@pytest.fixture(scope="module")
def buffer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proving]:
    """BUFFER's original and reference runs, shared by the trials of its two edits."""
    proving = Proving(tmp_path_factory.mktemp("buffer"), BUFFER)
    yield proving
    proving.close()


def insert(line: int, indent: int, text: str) -> Edit:
    return Edit("train.py", Position(line, indent), Position(line, indent), "", text + "\n" + " " * indent)




def test_a_clone_before_a_write_that_saves_its_own_operands_is_not_proven(buffer: Proving) -> None:
    # issue 23, item 2: the clone is both read and written, so the finding stays
    verdict, findings = buffer.trial([insert(9, 4, "buf = buf.clone()")])
    assert not verdict.gone and not verdict.proven
    assert [f.code for f in serious(findings)] == ["IPD101"]


def test_computing_the_value_then_writing_into_a_copy_is_proven_bit_for_bit(buffer: Proving) -> None:
    write = Edit("train.py", Position(9, 4), Position(9, 38), "buf[4] = torch.mul(buf[2], buf[3])",
                 "v = torch.mul(buf[2], buf[3])\n    buf = buf.clone()\n    buf[4] = v")
    verdict, findings = buffer.trial([write])
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
    verdict, findings = prove(tmp_path, source, move_step(24))
    assert verdict.gone and not verdict.new and verdict.comparison == "differs", verdict
    assert not verdict.proven and "differs from the intended program's" in verdict.first_difference
    assert not serious(findings)


def test_moving_the_step_past_the_backward_alone_is_proven(tmp_path: Path) -> None:
    source = ACTOR_CRITIC.replace("POLYAK_HERE\n", "").replace("POLYAK_LAST\n", POLYAK + "\n")
    verdict, _ = prove(tmp_path, source, move_step(21))
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
    verdict, findings = prove(tmp_path, TWO_WRITES, [insert(9, 4, "h = h.clone()")])
    assert verdict.proven, verdict
    assert not serious(findings)
