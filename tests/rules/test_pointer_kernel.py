"""A custom kernel that writes through a raw pointer (issue 37, item 5).

A fused kernel (Triton-style) launched on `.data_ptr()` writes its result into memory autograd
saved: no op ran, no version moved, and backward silently computes from the kernel's values
(IPD109). The finding names the launch (the call the pointer is passed to) as the write, says in
the text report when the writing line itself was not found, and its fix keeps the write's
purpose: a copy made before the launch, which the kernel writes and the program reads on, while
the tensor autograd saved keeps its values. `fix` proves that edit on the program and writes it.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import inplace_doctor as ipd
from inplace_doctor.findings import FixKind
from inplace_doctor.render.text import render as render_text

KERNEL = textwrap.dedent("""
    import ctypes
    import torch


    def fused_scale_kernel(ptr, n, scale):
        \"\"\"A stand-in for a Triton/CUDA launch: scales the buffer in place through its raw pointer.\"\"\"
        buf = (ctypes.c_float * n).from_address(ptr)
        for i in range(n):
            buf[i] = buf[i] * scale


    def step(x):
        h = torch.sigmoid(x)  # <save>
        fused_scale_kernel(h.data_ptr(), h.numel(), 2.0)  # <launch>
        return h


    if __name__ == "__main__":
        torch.manual_seed(0)
        x = torch.randn(8, requires_grad=True)
        out = step(x)
        out.sum().backward()
        print("grad", [round(v, 4) for v in x.grad[:3].tolist()])
        print("out", [round(v, 4) for v in out[:3].tolist()])
""")


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(KERNEL.splitlines(), 1) if marker in text)


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(KERNEL)
    return script


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_the_launch_is_named_as_the_write_and_the_fix_keeps_its_purpose(tmp_path: Path, deep: bool) -> None:
    script = _script(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(KERNEL, str(script), "exec"), namespace)  # the file's functions, with its lines
    import torch

    x = torch.randn(8, requires_grad=True)
    with ipd.watch(deep=deep) as session:
        out = namespace["step"](x)  # type: ignore[operator]
        out.sum().backward()
    (f,) = session.findings
    assert f.code == "IPD109" and f.confirmed is True
    assert f.mutation.op == "fused_scale_kernel" and f.mutation.line == _line("<launch>")
    (fx,) = f.fixes
    assert fx.kind is FixKind.CLONE_BEFORE_WRITE and fx.edits[0].new.strip() == "h = h.clone()"
    assert fx.edits[0].start.line == _line("<launch>")
    out_text = io.StringIO()
    render_text(session.report(), out_text, color=False)
    text = out_text.getvalue()
    assert "overwritten `fused_scale_kernel`" in text
    assert "  written: " in text  # the text says the writing line itself was not found, and why
    assert "hand out a copy" not in text and "insert `h = h.clone()`" in text


def test_fix_proves_the_copy_before_the_launch(tmp_path: Path) -> None:
    script = _script(tmp_path)
    for argv in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "i"]):
        subprocess.run(["git", *argv], cwd=tmp_path, check=True)
    before = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "fix", str(script)], capture_output=True, text=True, timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fixed IPD109" in done.stdout and "(proven:" in done.stdout
    lines = script.read_text().splitlines()
    assert lines[_line("<launch>") - 1].strip() == "h = h.clone()"
    after = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    # the kernel's output is kept (the program reads the scaled copy); the gradient is sigmoid's own
    assert after.stdout.splitlines()[1] == before.stdout.splitlines()[1]
    assert after.stdout.splitlines()[0] != before.stdout.splitlines()[0]
