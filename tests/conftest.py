"""Shared test helpers.

- `line_of(path_or_source, needle)`: a plain function, `from conftest import line_of`
  (pytest's default "prepend" import mode puts tests/ on sys.path for this file).
- `marker_line(path, name)`: the one line of a test file ending with the marker comment
  `# <name>` (exactly one), so assertions survive edits.
- `in_fresh_thread(fn, *args)`: call `fn` where no frame of the test or of pytest is
  below it, as a script or the console command runs.
- `factory_module(name, source)` (fixture): an importable module of model factories for
  the CLI's `name:factory` specs, gone again after the test.
- `_no_tool_leftovers` (autouse, tests/trace and tests/engines only): a test that leaves a patch,
  mode or hook of the tool behind (`_no_leftovers.py`: what sessions change, and the mode and hook
  state) fails where the leak starts, and the next test starts clean.
- `@pytest.mark.cuda` (tests/cuda): skipped, all with one reason from one line here (one line of
  `-ra`'s summary), where `torch.cuda.is_available()` is False.
- `--regen-golden`: rewrite the golden files under tests/render/golden/ instead of
  comparing with them; tests read it through the `regen_golden` fixture.
- Every test ends with the fast tracer's kernels removed: they linger a second after
  a `watch` (trace/process/kernel_registration.py), and no test leaves them to the next.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def _text_of(path_or_source: str | os.PathLike[str]) -> str:
    """A path (Path, or a str naming an existing file) is read; any other str is the source itself."""
    if isinstance(path_or_source, os.PathLike):
        return Path(path_or_source).read_text(encoding="utf-8")
    if "\n" not in path_or_source and os.path.isfile(path_or_source):
        return Path(path_or_source).read_text(encoding="utf-8")
    return path_or_source


def marker_line(path: str | os.PathLike[str], marker: str) -> int:
    """The 1-based line of `path` that ends with the comment `# <marker>`; there must be exactly one."""
    hits = [i + 1 for i, text in enumerate(Path(path).read_text().splitlines()) if text.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times in {path}"
    return hits[0]


def line_of(path_or_source: str | os.PathLike[str], needle: str) -> int:
    """The 1-based number of the first line containing `needle`.

    `path_or_source` is a file (a `Path`, or a `str` naming an existing file,
    such as a test's `__file__`) or source text. Raises `LookupError` when no
    line contains `needle`, so a stale marker fails loudly instead of pointing
    at line 0.
    """
    for number, text in enumerate(_text_of(path_or_source).splitlines(), 1):
        if needle in text:
            return number
    where = path_or_source if isinstance(path_or_source, os.PathLike) or "\n" not in path_or_source else "<source>"
    raise LookupError(f"no line contains {needle!r} in {where}")


def in_fresh_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a new thread: its return value, or its exception re-raised here.

    inplace-doctor takes every frame outside torch, itself and the standard library
    for the user's (installed packages, pytest's included) and shows them: in
    `called from` lines, the JSON stacks, and the caller's line that folds findings.
    A new thread's stack starts in the standard library (threading), as the
    console command's starts in the tool, so the output is what a user sees.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--regen-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/render/golden/ from fresh output instead of comparing",
    )


NEEDS_CUDA = "needs a CUDA device (torch.cuda.is_available() is False)"


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A `cuda` test without a CUDA device: skipped from this line, so `-ra` folds them all into one."""
    if item.get_closest_marker("cuda") is not None and not _cuda_available():
        pytest.skip(NEEDS_CUDA)


@pytest.fixture
def regen_golden(request: pytest.FixtureRequest) -> bool:
    """True when pytest ran with --regen-golden."""
    return bool(request.config.getoption("--regen-golden"))


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], None]]:
    """`factory_module(name, source)`: an importable module `name` holding `source` (model factories
    for the CLI's `name:factory` specs), removed from `sys.modules` before and after the test."""
    import sys

    names: list[str] = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, name, raising=False)
        names.append(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def _no_lingering_write_kernels() -> Iterator[None]:
    """The fast tracer's kernels, still registered after a test's last `watch`, removed at its end."""
    yield
    _end_linger()


def _end_linger() -> None:
    kernels = sys.modules.get("inplace_doctor.trace.fast.write_kernels")
    if kernels is not None:
        kernels.end_linger()


_CHECKED_FOR_LEFTOVERS = {"trace", "engines"}  # the folders whose tests run the tracer's parts directly


@pytest.fixture(autouse=True)
def _no_tool_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """In tests/trace and tests/engines: nothing of the tool left behind after each test (about
    0.5 ms a test; the first one also finds, once, what sessions change: a few seconds)."""
    path = Path(str(request.node.path))
    if path.parent.name not in _CHECKED_FOR_LEFTOVERS or path.parent.parent != Path(__file__).parent:
        yield
        return
    import _no_leftovers

    before = _no_leftovers.Leftovers.quick()
    yield
    _end_linger()  # the fast tracer's kernels linger a second after a watch: not a leftover
    found = _no_leftovers.leftovers(before)
    if found:
        _no_leftovers.put_back(before)
        pytest.fail("left behind by this test (put back for the next):\n" + "\n".join(found), pytrace=False)
