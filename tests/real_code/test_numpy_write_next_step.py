"""Bug suite: a training step writes a saved tensor through `.numpy()` each step; `run --steps` names the line.

`run` cannot run a script's step twice (its side effects would repeat), so the step that first
sees the saved tensor's bytes change finds no line (no op ran). The next watched step saves a
tensor at the same place and writes it again: checked after each line of the user's code, the
change recurs at the NumPy line, and the finding names it and the step it was found on. With
`--steps 1` no watched step follows, and the finding says so.

The program (of our own, in the shape of the NumPy hand-outs the bug reports show) centres its
tanh activations in NumPy from the training loop (`centre(h.detach().numpy())`): that writes
the very tensor `TanhBackward0` saved, so every step's gradient is silently computed from the
centred values.

The findings are read from `inplace-doctor run` called in-process (`main([...])`, in a fresh
thread as the console command's stack starts outside the user's code): what is checked is the
line search, not process isolation, and each run is checked to leave none of the tool's patches,
modes, hooks or trace functions behind (`_no_leftovers`). One test runs the command as a process
(`python -m inplace_doctor run`) beside plain `python`, for its exit code and the bits it trains to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PROGRAM = '''
import gc
import sys
import weakref

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)


def centre(arr):
    arr -= arr.mean(axis=0)  # <helper-write>


def main():
    body, head = nn.Linear(5, 7), nn.Linear(7, 1)
    optimizer = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1)
    x, y = torch.randn(12, 5), torch.randn(12, 1)
    for step in range(STEPS):
        optimizer.zero_grad()
        h = torch.tanh(body(x))  # <saved>
        arr = h.detach().numpy()  # <handout>
        WRITE
        loss = ((head(h) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    torch.save({"loss": loss.detach(), **body.state_dict(), **head.state_dict()}, sys.argv[1])
    last = weakref.ref(h)
    del h, arr, loss
    gc.collect()
    print("last step's activations:", "alive" if last() is not None else "freed")


main()
'''
WRITES = {
    "helper": ("centre(arr)  # <write>", "helper-write"),  # the line named is the helper's own
    "inline": ("arr -= arr.mean(axis=0)  # <write>", "write"),  # in the loop's own frame, running when armed
    "first-step-only": ("if step == 0: centre(arr)  # <write>", "helper-write"),
}


def write_program(tmp_path: Path, where: str, steps: int = 3) -> Path:
    path = tmp_path / f"centre_{where}.py"
    path.write_text(PROGRAM.replace("WRITE", WRITES[where][0]).replace("STEPS", str(steps)))
    return path


def marker(path: Path, name: str) -> int:
    [line] = [i for i, text in enumerate(path.read_text().splitlines(), 1) if f"# <{name}>" in text]
    return line


def command(path: Path, *options: str) -> list[str]:
    """`inplace-doctor run`'s arguments: the JSON report to report.json, the script's weights to result_watched.pt."""
    return ["run", *options, "--format", "json", "--output", str(path.parent / "report.json"),
            path.name, str(path.parent / "result_watched.pt")]


def ipd109(path: Path) -> list[dict]:
    report = path.parent / "report.json"
    findings = json.loads(report.read_text())["findings"] if report.exists() else []
    return [f for f in findings if f["code"] == "IPD109"]


def run(path: Path, *options: str) -> tuple[int, list[dict]]:
    """The command in-process, in the script's folder: (its exit status, its IPD109 findings). The
    script seeds torch's generator: the test's generator state is put back after."""
    import _no_leftovers
    from conftest import in_fresh_thread

    from inplace_doctor.cli.main import main

    if sys.gettrace() is not None:
        pytest.skip("another trace function (coverage, a debugger) is set: the search stands aside")
    before, rng, cwd = _no_leftovers.Leftovers.quick(), torch.random.get_rng_state(), os.getcwd()
    os.chdir(path.parent)
    try:
        status = in_fresh_thread(main, command(path, *options))
    finally:
        os.chdir(cwd)
        torch.random.set_rng_state(rng)
    assert _no_leftovers.leftovers(before) == []
    return status, ipd109(path)


def at(site: dict) -> tuple[str, int]:
    return Path(site["file"]).name, site["line"]


@pytest.mark.parametrize("where", ["helper", "inline"])
@pytest.mark.parametrize("steps", [2, 3])
def test_the_next_watched_step_names_the_numpy_line(tmp_path, where, steps):
    path = write_program(tmp_path, where)
    status, [finding] = run(path, "--steps", str(steps))
    assert status == 1
    assert finding["severity"] == "error" and finding["confirmed"] is True
    assert at(finding["mutation"]) == (path.name, marker(path, WRITES[where][1])), finding["message"]
    assert at(finding["saved"]) == (path.name, marker(path, "saved"))
    assert "found on watched step 2:" in finding["message"], finding["message"]
    assert f"handed out by `.numpy()` at {path.name}:{marker(path, 'handout')}" in finding["message"]
    if where == "helper":  # the helper's line, with the loop line that called it
        assert [f["line"] for f in finding["mutation"]["stack"]][-2:] == [marker(path, "write"), marker(path, "helper-write")]


@pytest.mark.parametrize("where", ["helper", "inline"])
def test_one_watched_step_says_no_later_step_followed(tmp_path, where):
    path = write_program(tmp_path, where)
    status, [finding] = run(path, "--steps", "1")
    assert status == 1
    assert at(finding["mutation"]) == (path.name, marker(path, "handout"))  # the hand-out: all that is known
    assert "the writing line is not named: no watched step followed the one that found the change" in finding["message"]


def test_a_write_that_does_not_recur_is_searched_for_in_two_later_steps_and_said(tmp_path):
    """The write happens in step 1 only: steps 2 and 3 are checked line by line (not the 4 after them),
    and the finding says the tensors saved there were checked and no line changed them."""
    path = write_program(tmp_path, "first-step-only", steps=6)
    status, [finding] = run(path, "--steps", "6")
    assert status == 1
    assert at(finding["mutation"]) == (path.name, marker(path, "handout"))
    assert (
        "the writing line is not named: in watched steps 2 to 3, the tensors saved at this place were checked after "
        "each line of your code, and no line changed their bytes"
    ) in finding["message"], finding["message"]


def test_a_script_with_one_step_says_no_later_step_followed(tmp_path):
    """Without --steps the whole script is watched; a change in its last step has no step after it."""
    path = write_program(tmp_path, "helper", steps=1)
    _, [finding] = run(path)
    assert at(finding["mutation"]) == (path.name, marker(path, "handout"))
    assert "no watched step followed the one that found the change" in finding["message"]


def test_the_search_changes_nothing_the_script_computes(tmp_path):
    """Watched with the line search armed (`python -m inplace_doctor run`, a process of its own: it exits 1
    and names the line), the script trains to the same bits as under plain python."""
    path = write_program(tmp_path, "helper")
    proc = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", *command(path, "--steps", "3")], capture_output=True, text=True,
        timeout=180, cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    [finding] = ipd109(path)
    assert at(finding["mutation"]) == (path.name, marker(path, "helper-write")), finding["message"]
    plain = subprocess.run(
        [sys.executable, path.name, str(tmp_path / "result_plain.pt")], capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )
    assert plain.returncode == 0, plain.stderr
    watched, expected = torch.load(tmp_path / "result_watched.pt"), torch.load(tmp_path / "result_plain.pt")
    assert watched.keys() == expected.keys()
    assert all(torch.equal(watched[k], expected[k]) for k in expected)


def test_the_search_leaves_no_trace_function_behind(tmp_path, monkeypatch, capsys):
    """In process: after the script no trace function of the tool is set, the tensors the loop's frame
    (traced in step 2) dropped are freed, and the finding names the line."""
    if sys.gettrace() is not None:
        pytest.skip("another trace function (coverage, a debugger) is set: the search stands aside")
    from inplace_doctor.cli.scripts.script import run_script

    path = write_program(tmp_path, "helper", steps=2)  # the last step is the one searched
    monkeypatch.chdir(tmp_path)
    status, report, stats = run_script(str(path), [str(tmp_path / "result.pt")], steps=2)
    assert sys.gettrace() is None
    assert sys._getframe().f_trace is None  # this frame was running when the search was armed
    assert "last step's activations: freed" in capsys.readouterr().out  # nothing of the search holds them
    [finding] = [f for f in report.findings if f.code == "IPD109"]
    assert (Path(finding.mutation.file).name, finding.mutation.line) == (path.name, marker(path, "helper-write"))
    assert finding.facts.search_steps == (2, 2)
