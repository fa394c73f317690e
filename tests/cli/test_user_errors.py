"""Whose error it is, and the exit code that says so (issue 24: items 8, 16, 20, 21, 22, 23).

The user's model, factory, module or script that raises or exits is exit 3 (1 under `run`, as
python), with the user's traceback without the tool's frames, then one line; a model the tool
cannot use (one that cannot be copied) is one usage line, exit 2; the tool's own bug alone is
exit 4. The tool's frames take no recursion depth from the program, and the current directory
stays importable while the factory runs, as under `python -c "import m; m.build()"`.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.errors import UsageError

FACTORY_MODULE = "ipd_user_error_factories"
FACTORY_SOURCE = '''
import argparse
import sys
import threading

import torch
from torch import nn


class Exits(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        sys.exit(0)  # <exit in forward>


def exits_in_forward():
    return Exits(), torch.randn(2, 4)


def exits_in_factory():
    sys.exit(0)


def parses_argv():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=4)
    width = parser.parse_args().width
    return nn.Linear(width, 4), torch.randn(2, width)


def needs_an_option():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, required=True)
    width = parser.parse_args().width
    return nn.Linear(width, 4), torch.randn(2, width)


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("this __str__ is broken")


class RaisesUnprintable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise Unprintable()


def raises_unprintable():
    return RaisesUnprintable(), torch.randn(2, 4)


class LockModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.lock = threading.Lock()

    def forward(self, x):
        with self.lock:
            return self.fc(x).relu()


def lock_model():
    return LockModel(), torch.randn(2, 4)


def raises_in_forward():
    return RaisesInForward(), torch.randn(2, 4)


class RaisesInForward(nn.Module):
    def forward(self, x):
        return self.helper(x)

    def helper(self, x):
        raise ValueError("forward failed on purpose")  # <raise in helper>


class Recurses(nn.Module):
    """Recursion in plain Python inside forward: the tool's frames are a constant."""

    def __init__(self, depth):
        super().__init__()
        self.depth = depth
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.go(self.fc(x), self.depth)

    def go(self, x, n):
        return x.relu() * 2 if n == 0 else self.go(x, n - 1)


class Nested(nn.Module):
    """Modules nested in modules: the tracer's hooks cost a frame per level, deepcopy two."""

    def __init__(self, depth):
        super().__init__()
        self.inner = Nested(depth - 1) if depth else nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(x) + 1


DEPTH = 0


def recurses():
    return Recurses(DEPTH), torch.randn(2, 4)


def nested():
    return Nested(DEPTH), torch.randn(2, 4)
'''
COMMANDS = ["audit", "verify", "memory", "optimize"]


@pytest.fixture
def factories(factory_module):
    factory_module(FACTORY_MODULE, FACTORY_SOURCE)
    __import__(FACTORY_MODULE)
    return sys.modules[FACTORY_MODULE]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def traceback_part(err: str) -> str:
    """What stderr shows before the tool's one last line."""
    return err.rstrip("\n").rsplit("\n", 1)[0]


def assert_no_tool_frames(err: str) -> None:
    shown = traceback_part(err)
    assert "inplace_doctor" not in shown and "importlib" not in shown and "runpy" not in shown, shown
    assert "inplace-doctor failed" not in err


# --- 8. sys.exit inside the model or its factory is the model's, exit 3 ---------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_sys_exit_in_forward_is_exit_3_not_a_clean_0(capsys, factories, command):
    code, _, err = run_cli(capsys, command, f"{FACTORY_MODULE}:exits_in_forward")
    assert code == 3, err
    assert "sys.exit(0)  # <exit in forward>" in err  # where the model exited: its own traceback
    last = err.splitlines()[-1]
    assert last.startswith(f"inplace-doctor: Exits called sys.exit(0) during {command}"), last
    assert "nothing is reported clean" in last
    assert_no_tool_frames(err)


def test_sys_exit_in_the_factory_is_exit_3(capsys, factories):
    code, _, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:exits_in_factory")
    assert code == 3, err
    last = err.splitlines()[-1]
    assert last.startswith(f"inplace-doctor: calling {FACTORY_MODULE}:exits_in_factory ended in sys.exit(0)"), last
    assert "a factory must return the model" in last
    assert_no_tool_frames(err)


def test_a_factory_parsing_argv_sees_its_own_program_not_the_tools_arguments(capsys, factories, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["inplace-doctor", "audit", f"{FACTORY_MODULE}:parses_argv"])
    code, _, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:parses_argv")
    assert code == 0, err  # argparse saw no arguments, so the defaults: as `python -c "import m; m.parses_argv()"`
    assert sys.argv == ["inplace-doctor", "audit", f"{FACTORY_MODULE}:parses_argv"]  # given back


def test_argparse_exiting_in_the_factory_is_the_factorys_error(capsys, factories, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["inplace-doctor", "audit", f"{FACTORY_MODULE}:needs_an_option"])
    code, _, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:needs_an_option")
    assert code == 3, err
    assert f"usage: {FACTORY_MODULE}.py [-h] --width WIDTH" in err  # argparse names the factory's program
    assert "the following arguments are required: --width" in err
    last = err.splitlines()[-1]
    assert "ended in sys.exit(2) from argparse, which parsed sys.argv" in last, last


# --- 16. the user's own mistakes are not the tool's bug --------------------------------------------

NOT_COMPILING = {
    "syntax": (b"import torch\ndef f(:\n    pass\n", "SyntaxError: invalid syntax", 'line 2'),
    "unknown encoding": (b"# -*- coding: no-such-codec -*-\nx = 1\n", "no-such-codec", "SyntaxError"),
    "not utf-8": (b'x = "\xff\xfe"\n', "SyntaxError", "Non-UTF-8 code starting with '\\xff'"),  # python's words
}


@pytest.mark.parametrize("case", list(NOT_COMPILING))
def test_a_script_that_does_not_compile_under_run_is_exit_1_with_pythons_message(capsys, tmp_path, case):
    source, *words = NOT_COMPILING[case]
    script = tmp_path / "broken.py"
    script.write_bytes(source)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
    assert plain.returncode == 1 and "SyntaxError" in plain.stderr  # what python does
    code, _, err = run_cli(capsys, "run", str(script))
    assert code == 1, err
    assert "broken.py" in err and all(word in err for word in words), err
    assert "Traceback" not in err  # python shows no frames for a script that does not compile
    assert_no_tool_frames(err)


def test_fix_of_a_script_that_does_not_compile_shows_pythons_message_exit_1(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\ndef f(:\n    pass\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-m", "inplace_doctor", "fix", str(script)], capture_output=True,
                          text=True, cwd=tmp_path, env=env, check=False)
    assert done.returncode == 1, done.stderr
    assert "SyntaxError: invalid syntax" in done.stderr and "line 2" in done.stderr
    assert "inplace-doctor failed" not in done.stderr and "nothing to fix" not in done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_exception_whose_str_raises_is_the_models(capsys, factories, command):
    code, _, err = run_cli(capsys, command, f"{FACTORY_MODULE}:raises_unprintable")
    assert code == 3, err
    assert "Unprintable: <exception str() failed>" in err  # as python's own traceback prints it
    last = err.splitlines()[-1]
    assert last.startswith("inplace-doctor: RaisesUnprintable raised Unprintable during "), last
    assert_no_tool_frames(err)


# --- 20. the tool's frames take no recursion depth from the program --------------------------------


def deepest(build: Callable[[int], Any], run: Callable[[Any], None], high: int) -> int:
    """The largest depth `run(build(depth))` reaches without RecursionError, from this frame."""
    low = 0
    while low < high:
        mid = (low + high + 1) // 2
        try:
            run(build(mid))
            low = mid
        except RecursionError:
            high = mid - 1
    return low


def plain_step(made: Any) -> None:
    model, x = made
    model(x).sum().backward()


@pytest.mark.parametrize("factory", ["recurses", "nested"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_recursing_near_the_limit_runs_under_the_tool_as_in_plain_pytorch(capsys, factories, command, factory):
    limit = sys.getrecursionlimit()
    build = getattr(factories, factory)
    model_class = {"recurses": factories.Recurses, "nested": factories.Nested}[factory]
    depth = deepest(lambda d: (model_class(d), torch.randn(2, 4)), plain_step, limit) - 2  # plain PyTorch runs it
    factories.DEPTH = depth
    plain_step(build())  # here, as in the test of the tool below
    code, _, err = run_cli(capsys, command, f"{FACTORY_MODULE}:{factory}")
    assert code == 0, err[-2000:]
    assert "RecursionError" not in err
    assert sys.getrecursionlimit() == limit  # given back


def test_a_script_recursing_near_the_limit_runs_under_run_as_under_python(capsys, tmp_path):
    script = tmp_path / "deep.py"

    def write(depth: int) -> str:
        script.write_text(textwrap.dedent(f"""
            import torch
            from torch import nn

            class Nested(nn.Module):
                def __init__(self, depth):
                    super().__init__()
                    self.inner = Nested(depth - 1) if depth else nn.Linear(4, 4)

                def forward(self, x):
                    return self.inner(x) + 1

            Nested({depth})(torch.randn(2, 4)).sum().backward()
        """), encoding="utf-8")
        return str(script)

    depth = deepest(write, lambda path: runpy.run_path(path, run_name="__main__"), sys.getrecursionlimit()) - 2
    code, _, err = run_cli(capsys, "run", write(depth))
    assert code == 0, err[-2000:]


# --- 21. a model that cannot be copied ------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "memory", "optimize"])
def test_a_model_that_cannot_be_copied_is_one_usage_line_naming_the_attribute(capsys, factories, command):
    code, _, err = run_cli(capsys, command, f"{FACTORY_MODULE}:lock_model")
    assert code == 2, err
    [line] = err.splitlines()
    assert line.startswith("inplace-doctor: error: LockModel cannot be copied: copy.deepcopy raised TypeError"), line
    assert "`LockModel.lock` (a _thread.lock)" in line
    assert "verify, memory and optimize run on a deep copy" in line and "__deepcopy__" in line
    assert " raised TypeError during" not in line  # the model never raised


def test_audit_needs_no_copy_of_the_same_model(capsys, factories):
    code, _, err = run_cli(capsys, "audit", f"{FACTORY_MODULE}:lock_model")
    assert code == 0, err


def test_a_model_that_cannot_be_copied_is_a_usage_error_in_the_api(factories):
    model, x = factories.lock_model()
    with pytest.raises(UsageError, match="LockModel cannot be copied"):
        ipd.verify(model, x)


# --- 22. the user's module raising as it is imported ----------------------------------------------

IMPORT_FAILURES = {
    "raises": ("import torch\nraise RuntimeError('config file missing')\n", "RuntimeError: config file missing"),
    "imports a missing module": ("import torch\nimport no_such_helper_module_24\n",
                                 "ModuleNotFoundError: No module named 'no_such_helper_module_24'"),
    "does not compile": ("import torch\ndef f(:\n    pass\n", "SyntaxError: invalid syntax"),
}


@pytest.mark.parametrize("case", list(IMPORT_FAILURES))
def test_a_module_raising_as_it_is_imported_is_exit_3_with_its_traceback(capsys, factory_module, case):
    source, shown = IMPORT_FAILURES[case]
    factory_module("ipd_user_error_import", source)
    code, _, err = run_cli(capsys, "audit", "ipd_user_error_import:build")
    assert code == 3, err
    assert 'ipd_user_error_import.py", line 2' in err and shown in err
    first = shown.split(":")[0]
    assert err.splitlines()[-1].startswith(f"inplace-doctor: importing 'ipd_user_error_import' raised {first}")
    assert_no_tool_frames(err)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_raising_shows_its_traceback_without_the_tools_frames(capsys, factories, command):
    code, _, err = run_cli(capsys, command, f"{FACTORY_MODULE}:raises_in_forward")
    assert code == 3, err
    assert "in helper" in err and "# <raise in helper>" in err
    assert_no_tool_frames(err)


# --- 23. the current directory stays importable while the factory runs ---------------------------


def test_a_factory_importing_lazily_from_the_current_directory_works(capsys, tmp_path, monkeypatch):
    (tmp_path / "ipd_lazy_model.py").write_text(textwrap.dedent("""
        def build():
            import ipd_lazy_helper  # imported only when the factory runs
            return ipd_lazy_helper.make()
    """), encoding="utf-8")
    (tmp_path / "ipd_lazy_helper.py").write_text(textwrap.dedent("""
        import torch
        def make():
            return torch.nn.Linear(4, 4), torch.randn(2, 4)
    """), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    here = {"", os.getcwd(), str(tmp_path)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    for name in ("ipd_lazy_model", "ipd_lazy_helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    path_before = list(sys.path)
    code, _, err = run_cli(capsys, "audit", "ipd_lazy_model:build")
    assert code == 0, err
    assert sys.path == path_before  # given back
    for name in ("ipd_lazy_model", "ipd_lazy_helper"):
        sys.modules.pop(name, None)
