"""`inplace-doctor run`: a script under watch(), its arguments and output intact, exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_a_broken_training_script_prints_both_sites_and_exits_non_zero() -> None:
    done = run_cli("-m", "inplace_doctor.examples.train", "--broken", "--steps", "3")
    assert done.returncode == 1, done.stderr
    train = "inplace_doctor/examples/train.py:29"
    assert "IPD101" in done.stderr and "stopped at an in-place error" in done.stderr
    assert "overwritten `relu_`" in done.stderr and "saved       `sigmoid` -> SigmoidBackward0.result" in done.stderr
    assert done.stderr.count(train) >= 2
    # Where the write ran comes first (chained in front of PyTorch's error), then the script's
    # traceback as python prints it; the diagnosis is added after it.
    lines = done.stderr.splitlines()
    assert lines[0] == "inplace_doctor.errors.WrittenHere: the in-place write `relu_` ran here (most recent call last):"
    assert "Traceback (most recent call last):" in lines
    [error_at] = [i for i, line in enumerate(lines) if line.startswith("RuntimeError: one of the variables needed")]
    assert lines[error_at + 1].startswith("inplace-doctor: the script stopped at an in-place error (IPD101): ")
    assert lines[-1] == "inplace-doctor: 1 finding(s); no backward pass completed"


def test_a_clean_script_exits_zero_with_its_output_and_arguments_intact() -> None:
    args = ["--steps", "4", "--every", "2", "--", "-x", "--select", "a b"]  # the script's own arguments
    done = run_cli("-m", "inplace_doctor.examples.train", *args)
    assert done.returncode == 0, done.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "inplace_doctor.examples.train", *args], capture_output=True, text=True, timeout=120
    )
    assert done.stdout == plain.stdout  # the report goes to stderr; stdout is the script's own
    assert "argv: ['--steps', '4', '--every', '2', '--', '-x', '--select', 'a b']" in done.stdout
    assert "step 4: loss" in done.stdout  # the script's own --steps and --every reached it
    assert "0 finding(s); watched 4 optimizer steps" in done.stderr


def test_a_script_path_runs_as_main_with_its_folder_on_sys_path(tmp_path: Path) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 42\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import helper_mod
        print(__name__, helper_mod.VALUE, sys.argv)
        w = torch.randn(3, requires_grad=True)
        y = w.exp()
        y.add_(1)  # overwrites exp's saved result
        y.sum().backward()
    """))
    done = run_cli(str(script), "--flag", cwd=tmp_path)
    assert done.returncode == 1
    assert f"__main__ 42 ['{script}', '--flag']" in done.stdout
    assert "train.py:8" in done.stderr and "IPD101" in done.stderr


@pytest.mark.parametrize("code,expected", [("sys.exit(3)", 3), ("sys.exit(0)", 0), ("raise ValueError('boom')", 1)])
def test_the_scripts_own_exit_status_wins(tmp_path: Path, code: str, expected: int) -> None:
    script = tmp_path / "s.py"
    script.write_text(f"import sys\n{code}\n")
    done = run_cli(str(script))
    assert done.returncode == expected
    if expected == 1:
        assert "ValueError: boom" in done.stderr


def test_fail_fast_stops_at_the_backward_that_reaches_the_write_and_names_the_write(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        w = torch.randn(3, requires_grad=True)
        y = w.sigmoid()
        y.mul_(2)
        print("still running")
        y.sum().backward()
        print("after backward")
    """))
    done = run_cli("--fail-fast", str(script))
    assert done.returncode == 1
    assert "still running" in done.stdout and "after backward" not in done.stdout
    assert "s.py:5" in done.stderr and 'line 5' in done.stderr  # the write, chained in front of the error


def test_fail_fast_lets_a_graph_that_is_never_backpropagated_run_on(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        w = torch.randn(3, requires_grad=True)
        for _ in range(3):
            y = w.sigmoid()   # rebound each iteration: the old graph is freed, never backpropagated
            y.mul_(2)
        print("still running")
    """))
    done = run_cli("--fail-fast", str(script))
    assert done.returncode == 0, done.stderr
    assert "still running" in done.stdout and not re.search(r"^(error|warning)\s", done.stderr, re.M), done.stderr


def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_cli(str(tmp_path / "missing.py"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no script" in done.stderr
    done = run_cli("--select", "IPD999", "-m", "inplace_doctor.examples.train")
    assert done.returncode == 2 and "unknown rule code" in done.stderr


def test_steps_1_leaves_the_rest_of_the_script_running_no_tracer_code(tmp_path: Path) -> None:
    # Not a timing assert (a loaded machine makes any bound flaky): after `--steps 1` the only code of
    # the tool's a later step runs is the step counter's and, for an in-place op, the pass-through of the
    # write kernels whose registration lingers (test_write_kernels_linger.py), whatever the model holds
    # (modules, in-place activations, an optimizer): no hook, mode, patched function or record of a tracer.
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        from torch import nn
        import torch.nn.functional as F
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(32, 32), nn.GELU(), nn.ReLU(inplace=True))])
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(16, 32)
        def step():
            opt.zero_grad(); h = model(x) * 1.0; h += 1; F.hardtanh(h * 2, inplace=True).sum().backward(); opt.step()
        for _ in range(3):
            step()
        seen = set()
        def profile(frame, event, arg):
            if event == "call" and "inplace_doctor" in frame.f_code.co_filename:
                seen.add(frame.f_code.co_filename.rsplit("inplace_doctor", 1)[1] + ":" + frame.f_code.co_qualname)
        sys.setprofile(profile)
        step()
        sys.setprofile(None)
        print("\\n".join(sorted(seen)))
    """))
    watched = run_cli("--steps", "1", str(script))
    assert watched.returncode == 0, watched.stderr
    assert "then 3 unwatched" in watched.stderr
    called = watched.stdout.split()
    assert any("StepCounter" in c for c in called), called  # the profile sees the tool's code when it runs
    passing = ("/cli/scripts/steps.py:", "/trace/raised/blame.py:call_through", "/trace/fast/write_kernels.py:_kernel.",
               "/trace/ops.py:written_tensors")
    assert [c for c in called if not c.startswith(passing)] == []


def test_a_long_loop_under_watch_does_not_grow_memory() -> None:
    import gc

    import torch
    from torch import nn

    import inplace_doctor as ipd

    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)

    def live() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))

    with ipd.watch(model) as session:
        for i in range(120):  # 100 steps after the first count: a tensor kept per step would show 100 times over
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if i == 20:
                early = (live(), session.tracer.live_saved_tensors())
        late = (live(), session.tracer.live_saved_tensors())
    # a tensor kept per step would be 100 more; a few come and go with the process (other threads)
    assert late[0] - early[0] < 20 and late[1] == early[1] == 0, (early, late)
    assert session.findings == []
