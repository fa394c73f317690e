"""Where the tool's output goes (issue 24, items 18 and 19), and a script's own `ipd.watch()`
under `inplace-doctor run` (item 9).

Real processes: what is tested is what a shell sees (exit status, the bytes on each stream).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import line_of


def cli(*args: str, cwd: Path | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", **kwargs.pop("env", {})}
    kwargs.setdefault("capture_output", "stdout" not in kwargs)
    if "stdout" in kwargs:
        kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", *args], text=True, timeout=300, cwd=cwd, env=env, **kwargs
    )


def no_traceback(text: str) -> bool:
    return "Traceback" not in text and "inplace-doctor failed" not in text and "Exception ignored" not in text


# -- item 18: the tool's own stdout ------------------------------------------------------------

def test_stdout_on_a_full_disk_is_one_line_and_exit_2() -> None:
    with open("/dev/full", "w") as full:
        done = cli("rules", stdout=full)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "inplace-doctor: error: cannot write to stdout: No space left on device\n"


@pytest.mark.parametrize("args", [("rules",), ("rule", "IPD101"), ("audit", "inplace_doctor.examples:sigmoid_then_relu")])
def test_a_closed_pipe_ends_quietly_with_141_as_git_does(args: tuple[str, ...]) -> None:
    # `inplace-doctor rules | head -1` with head already gone: the read end is closed before the
    # tool writes, so the write fails every time (not only when the output outgrows the pipe).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = cli(*args, stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_an_ascii_terminal_gets_a_non_ascii_path_escaped(tmp_path: Path) -> None:
    (tmp_path / "modèle.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class M(nn.Module):
            def forward(self, x):
                y = x.sigmoid()
                y.relu_()
                return y

        def make():
            return M(), (torch.randn(2, 3, requires_grad=True),)
    """))
    done = cli("audit", "modèle:make", cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 1, done.stderr
    assert no_traceback(done.stderr), done.stderr
    assert "IPD101" in done.stdout and "mod\\xe8le.py:7" in done.stdout


def test_every_write_of_the_tool_is_escaped_for_its_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from inplace_doctor.printing import tool_streams

    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    with tool_streams():
        print("modèle.py:7")
        sys.stdout.writelines(["--- modèle.py\n", "+++ modèle.py\n"])  # what `fix --diff` writes
        sys.stdout.flush()
    assert sys.stdout is ascii_out
    assert raw.getvalue().decode("ascii").splitlines() == ["mod\\xe8le.py:7", "--- mod\\xe8le.py", "+++ mod\\xe8le.py"]


# -- item 19: a script that closes or replaces sys.stderr --------------------------------------

CAUGHT_IPD101 = """
import os, sys, torch
w = torch.randn(3, requires_grad=True)
y = w.exp()
y.add_(1)
try:
    y.sum().backward()
except RuntimeError:
    pass
"""


@pytest.mark.parametrize(
    "does",
    [
        "sys.stderr.close()",
        "sys.stderr = open(os.devnull, 'w')",
        "sys.stderr = None",
        "sys.stdout.close(); sys.stderr.close()",
        "sys.stderr.close(); raise ValueError('after closing stderr')",
    ],
)
def test_the_report_goes_to_the_stderr_the_tool_was_started_with(tmp_path: Path, does: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(CAUGHT_IPD101 + does + "\n")
    done = cli("run", str(script))
    assert done.returncode == 1, done.stderr
    assert "Exception ignored" not in done.stderr and "lost sys.stderr" not in done.stderr
    assert "inplace-doctor failed" not in done.stderr
    assert "overwritten `add_`" in done.stderr
    assert done.stderr.rstrip().endswith("inplace-doctor: 1 finding(s); no backward pass completed")
    if "raise" in does:  # the script's own traceback is not lost either
        assert "ValueError: after closing stderr" in done.stderr


# -- item 9: a script's own watch() under `inplace-doctor run`, and nested watch() blocks -------

def test_a_scripts_own_watch_reaches_runs_report(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        import inplace_doctor as ipd

        w = torch.randn(3, requires_grad=True)
        try:
            with ipd.watch() as session:
                y = w.exp()
                y.add_(1)
                y.sum().backward()
        except ipd.InplaceError as e:
            print("the script's own watch raised", [f.code for f in e.findings])
    """))
    done = cli("run", "train.py", cwd=tmp_path)
    assert "the script's own watch raised ['IPD101']" in done.stdout  # the inner block behaves as written
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("error   IPD101") == 1
    assert "overwritten `add_` at train.py:9" in done.stderr
    assert done.stderr.rstrip().endswith("inplace-doctor: 1 finding(s); no backward pass completed")


def _stale_exp(w: torch.Tensor) -> torch.Tensor:
    y = w.exp()
    y.add_(1)  # <stale exp>
    return y


def test_an_inner_watch_is_its_own_and_the_outer_holds_its_findings_once() -> None:
    import inplace_doctor as ipd

    w = torch.randn(3, requires_grad=True)
    with pytest.raises(ipd.InplaceError), ipd.watch() as alone:
        _stale_exp(w).sum().backward()
    with ipd.watch() as outer:
        for _ in range(2):  # the same cause again, in a second inner block (called from the same line)
            with pytest.raises(ipd.InplaceError), ipd.watch() as inner:
                _stale_exp(w).sum().backward()
    def facts(session: ipd.watch) -> list[tuple[Any, ...]]:
        return [(f.code, f.severity, f.confirmed, f.mutation.line, f.saved and f.saved.line) for f in session.findings]

    assert facts(inner) == facts(alone) and [f.code for f in inner.findings] == ["IPD101"]
    [finding] = outer.findings
    assert finding == inner.findings[0]  # one per cause, as the session that confirmed it reported it
    assert finding.confirmed and finding.mutation.line == line_of(__file__, "# <stale exp>")
    assert outer.report().findings == [finding] and outer.failed()


def test_a_write_in_the_inner_block_to_a_tensor_saved_before_it_is_the_outers() -> None:
    import inplace_doctor as ipd

    w = torch.randn(3, requires_grad=True)
    with ipd.watch() as outer:
        y = w.exp()
        with ipd.watch() as inner:
            y.add_(1)  # <saved outside>
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    assert inner.findings == []
    assert [(f.code, f.mutation.line) for f in outer.findings] == [("IPD101", line_of(__file__, "# <saved outside>"))]


def test_entering_an_open_watch_again_is_a_usage_error_and_the_watch_goes_on() -> None:
    """`with w:` inside `with w:` is the program's mistake, said in one line; the open session is intact."""
    import inplace_doctor as ipd

    w = torch.randn(3, requires_grad=True)
    session = ipd.watch()
    with pytest.raises(ipd.InplaceError), session:
        with pytest.raises(ipd.UsageError, match="this watch is already open"), session:
            pass
        _stale_exp(w).sum().backward()
    assert [(f.code, f.mutation.line) for f in session.findings] == [("IPD101", line_of(__file__, "# <stale exp>"))]
    assert torch._C._len_torch_function_stack() == 0 and torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_what_the_inner_session_confirms_after_its_block_reaches_the_outer() -> None:
    import inplace_doctor as ipd

    w = torch.randn(3, requires_grad=True)
    with ipd.watch() as outer:
        with ipd.watch() as inner:
            y = _stale_exp(w)
        assert not outer.findings[0].confirmed  # the inner block ended with a prediction
        try:
            y.sum().backward()  # the inner session's hooks check the tensor it saw saved
        except RuntimeError:
            pass  # the script caught it
    assert [f.confirmed for f in outer.findings] == [True]
    assert inner.findings[0].confirmed


def test_an_error_pytorch_raises_at_the_op_through_both_sessions_is_one_finding() -> None:
    import inplace_doctor as ipd

    w = torch.randn(3, requires_grad=True)
    with pytest.raises(ipd.InplaceError), ipd.watch() as outer, ipd.watch():
        w.add_(1)  # a leaf that requires grad: PyTorch raises here
    [finding] = outer.findings
    assert finding.code == "IPD102" and finding.count == 1
