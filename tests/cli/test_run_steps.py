"""`inplace-doctor run --steps N`: what counts as a step, where watching stops, and the last line.

Each script prints, at each optimizer step (from its own step hook, which runs before the
tool's) or after each backward pass, whether the tool is watching then (its saved-tensor hooks,
which both tracers install, are on autograd's stack), so the window's boundary is checked from inside the script.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from inplace_doctor.cli.main import main

LOOP = textwrap.dedent("""
    import sys
    import torch
    from torch import nn

    def watched():
        return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_post_hook(lambda *_: print(f"step watched={watched()}"))
    steps, micro = int(sys.argv[1]), int(sys.argv[2])
    for step in range(1, steps + 1):
        for _ in range(micro):
            model(torch.randn(2, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
""")

NO_OPTIMIZER = textwrap.dedent("""
    import torch

    w = torch.randn(3, requires_grad=True)
    for _ in range(4):
        print(f"before backward watched={torch._C._autograd._top_saved_tensors_default_hooks(False) is not None}")
        (w * 2).sin().sum().backward()
""")

MS = r"\d+\.\d ms per step"


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, source: str, *argv: str) -> tuple[int, list[str], str]:
    """Run `source` as a script under `inplace-doctor run`, in-process; return (exit, stdout lines, last line)."""
    script = tmp_path / "train.py"
    script.write_text(source)
    status = main(["run", *argv[: argv.index("--")], str(script), *argv[argv.index("--") + 1 :]])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()[-1]


def test_a_training_loop_is_counted_in_optimizer_steps_and_its_nth_update_is_watched(capsys, tmp_path) -> None:
    status, out, last = run(capsys, tmp_path, LOOP, "--steps", "3", "--", "6", "1")
    assert status == 0
    assert out == ["step watched=True"] * 3 + ["step watched=False"] * 3
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 3 optimizer steps, {MS} after the first; "
        rf"then 3 unwatched, {MS} over steps 5-6, the first \(step 4\) left out as warm-up \(--steps 3\)", last
    ), last


def test_steps_1_watches_the_first_optimizer_step_not_only_the_first_backward(capsys, tmp_path) -> None:
    # The first backward pass comes before any optimizer step: watching goes on to the step.
    status, out, last = run(capsys, tmp_path, LOOP, "--steps", "1", "--", "3", "1")
    assert status == 0
    assert out == ["step watched=True", "step watched=False", "step watched=False"]
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 1 optimizer step \(\d+\.\d\d s from the start, imports included\); "
        rf"then 2 unwatched, {MS} over step 3, the first \(step 2\) left out as warm-up \(--steps 1\)", last
    ), last


def test_gradient_accumulation_counts_optimizer_steps_once_one_is_seen(capsys, tmp_path) -> None:
    # 2 micro-batches per step: backward passes 1 and 2 come first, then the count is in steps.
    status, out, last = run(capsys, tmp_path, LOOP, "--steps", "3", "--", "4", "2")
    assert status == 0
    assert out == ["step watched=True"] * 3 + ["step watched=False"]
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 3 optimizer steps, {MS} after the first; "
        r"then 1 unwatched \(step 4\), too few for a figure without its warm-up \(--steps 3\)", last
    ), last


def test_n_backward_passes_before_any_optimizer_step_stop_at_the_next_backward(capsys, tmp_path) -> None:
    # 4 micro-batches per step and --steps 2: the 3rd backward pass starts before any step.
    status, out, last = run(capsys, tmp_path, LOOP, "--steps", "2", "--", "2", "4")
    assert status == 0
    assert out == ["step watched=False"] * 2
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 2 backward passes, {MS} after the first; "
        rf"then 6 unwatched, {MS} over steps 4-8, the first \(step 3\) left out as warm-up \(--steps 2\)", last
    ), last


def test_a_script_without_an_optimizer_is_counted_in_backward_passes(capsys, tmp_path) -> None:
    # After the 2nd backward pass watching goes on (an optimizer step could follow) until the 3rd starts.
    status, out, last = run(capsys, tmp_path, NO_OPTIMIZER, "--steps", "2", "--")
    assert status == 0
    assert out == ["before backward watched=True"] * 3 + ["before backward watched=False"]
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 2 backward passes, {MS} after the first; "
        rf"then 2 unwatched, {MS} over step 4, the first \(step 3\) left out as warm-up \(--steps 2\)", last
    ), last


def test_without_steps_every_optimizer_step_is_watched(capsys, tmp_path) -> None:
    status, out, last = run(capsys, tmp_path, LOOP, "--", "3", "1")
    assert status == 0 and out == ["step watched=True"] * 3
    assert re.fullmatch(rf"inplace-doctor: 0 finding\(s\); watched 3 optimizer steps, {MS} after the first", last), last


def test_the_optimizer_hooks_and_backward_wrappers_are_removed_on_exit(capsys, tmp_path) -> None:
    import torch
    from torch.optim import optimizer

    before = (dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks))
    backward = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
    run(capsys, tmp_path, LOOP, "--steps", "1", "--", "2", "1")
    run(capsys, tmp_path, LOOP + "raise SystemExit(4)\n", "--", "1", "1")
    assert (dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks)) == before
    assert (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad) == backward


FAILS_AT_STEP_4 = LOOP.replace(
    "    opt.zero_grad()\n", "    opt.zero_grad()\n    if step == 4:\n        raise ValueError(f'diverged at step {step}')\n"
)


def test_a_failure_after_the_window_says_so_and_names_the_steps_that_would_watch_it(capsys, tmp_path) -> None:
    status, out, last = run(capsys, tmp_path, FAILS_AT_STEP_4, "--steps", "2", "--", "6", "1")
    assert status == 1
    assert out == ["step watched=True"] * 2 + ["step watched=False"] * 2
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 2 optimizer steps, {MS} after the first; then 2 unwatched, {MS} over step 4, "
        r"the first \(step 3\) left out as warm-up; "
        r"the script failed after the watched window \(--steps 2\): run with --steps 5 to watch the failing step",
        last,
    ), last


def test_a_non_zero_exit_after_the_window_says_so_and_keeps_its_status(capsys, tmp_path) -> None:
    status, out, last = run(capsys, tmp_path, LOOP + "raise SystemExit(3)\n", "--steps", "1", "--", "2", "1")
    assert status == 3
    assert last.endswith(
        "the script failed after the watched window (--steps 1): run with --steps 3 to watch the failing step"
    ), last


def test_a_failure_inside_the_window_is_not_blamed_on_the_window(capsys, tmp_path) -> None:
    status, out, last = run(capsys, tmp_path, FAILS_AT_STEP_4, "--steps", "5", "--", "6", "1")
    assert status == 1 and out == ["step watched=True"] * 4
    assert re.fullmatch(rf"inplace-doctor: 0 finding\(s\); watched 4 optimizer steps, {MS} after the first", last), last


COMPILED = LOOP.replace("opt = torch.optim.SGD", "model = torch.compile(model, backend='eager')\nopt = torch.optim.SGD")
EAGER_NOTE = r"\d+ torch\.compile'd call\(s\) ran eagerly while watched"


@pytest.mark.parametrize("argv", [("--",), ("--steps", "3", "--")], ids=["no-steps", "steps-equal-to-the-run"])
def test_a_compiled_run_watched_to_its_end_does_not_claim_compiled_code_ran_after(capsys, tmp_path, argv) -> None:
    status, out, last = run(capsys, tmp_path, COMPILED, *argv, "3", "1")
    assert status == 0 and out == ["step watched=True"] * 3
    suffix = r" \(--steps 3\)" if "--steps" in argv else ""
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 3 optimizer steps, {MS} after the first{suffix}; {EAGER_NOTE}", last
    ), last


def test_compiled_code_after_the_window_is_said_and_timed_warm(capsys, tmp_path) -> None:
    # Step 3, the first after the window, compiles the model: the per-step figure is over step 4.
    status, out, last = run(capsys, tmp_path, COMPILED, "--steps", "2", "--", "4", "1")
    assert status == 0 and out == ["step watched=True"] * 2 + ["step watched=False"] * 2
    assert re.fullmatch(
        rf"inplace-doctor: 0 finding\(s\); watched 2 optimizer steps, {MS} after the first; then 2 unwatched, {MS} "
        rf"over step 4, the first \(step 3\) left out as warm-up \(--steps 2\); {EAGER_NOTE}, compiled as usual after",
        last,
    ), last


def test_the_unwatched_figure_leaves_out_the_first_unwatched_step() -> None:
    from inplace_doctor.cli.scripts.steps import Tally

    tally = Tally(watched=3)
    for elapsed in (2.0, 2.5, 3.0):  # step 4 took 2 s (compiling), steps 5 and 6 0.5 s each
        tally.unwatched_one(elapsed)
    assert tally.unwatched_text() == (
        "then 3 unwatched, 500.0 ms per step over steps 5-6, the first (step 4) left out as warm-up"
    )
