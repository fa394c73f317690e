"""The scratch copies a proof runs in: how big the project may be, what is not copied, and links kept
pointing into the copy (`prove.Workspace` makes the copies)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator

from ...printing import fmt_bytes
from ..errors import CliUsageError

SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
                     ".pytest_cache", ".ruff_cache", "node_modules"})


COPY_LIMIT = "INPLACE_DOCTOR_COPY_LIMIT"
_DEFAULT_LIMIT = 2 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}  # binary, as `du -h`


def copy_limit() -> int:
    """The most bytes a scratch copy of the project may hold: `INPLACE_DOCTOR_COPY_LIMIT` (bytes, or
    a number with K, M, G or T, binary), else 2 GiB."""
    raw = os.environ.get(COPY_LIMIT, "").strip()
    if not raw:
        return _DEFAULT_LIMIT
    text = raw.upper().removesuffix("B").removesuffix("I")  # 8G, 8GB, 8GiB
    unit = text[-1] if text and text[-1] in _UNITS else ""
    try:
        value = float(text[: len(text) - len(unit)])
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise CliUsageError(f"{COPY_LIMIT}={raw!r} is not a size: give bytes or a number with K, M, G or T, e.g. "
                            f"{COPY_LIMIT}=8G")
    return int(value * _UNITS[unit])


def check_room(root: str) -> None:
    """Refuse, before copying anything, a project whose copies would not fit: more bytes than
    `copy_limit()` (a dataset or checkpoints in the working directory: every check copies them
    again), or more than the scratch folder's disk has free for the two copies a check holds."""
    limit = copy_limit()
    size, parts = _tree_size(root, stop=limit)
    largest = ", ".join(f"{name} {fmt_bytes(n)}" for name, n in sorted(parts.items(), key=lambda p: -p[1])[:3])
    if size > limit:
        raise CliUsageError(
            f"the working directory {root} holds more than {fmt_bytes(limit)} ({largest}), and each fix is checked "
            "on a scratch copy of it: run from the folder that holds the program (files it reads by a path outside "
            f"that folder are read where they are, not copied), or raise the limit above its size ({COPY_LIMIT}: "
            "bytes or a number with K, M, G or T, e.g. 16G)")
    scratch = tempfile.gettempdir()
    free = shutil.disk_usage(scratch).free
    if 2 * size > free:
        raise CliUsageError(
            f"checking a fix holds two copies of the working directory ({fmt_bytes(size)} each: {largest}) in "
            f"{scratch}, which has {fmt_bytes(free)} free: free space there or set TMPDIR to a folder on a larger disk")


def _tree_size(root: str, stop: int) -> tuple[int, dict[str, int]]:
    """Bytes of the files a copy would hold (symbolic links are copied as links), and per top-level
    entry; the walk ends once past `stop`."""
    total, parts = 0, dict[str, int]()
    for rel, info in files_under(root, lambda folder, dirs: skip(folder, dirs)):
        if not stat.S_ISREG(info.st_mode):
            continue
        total += info.st_size
        top = rel.split(os.sep)[0] + ("/" if os.sep in rel else "")  # a folder's total as `data/`
        parts[top] = parts.get(top, 0) + info.st_size
        if total > stop:
            break
    return total, parts


def files_under(root: str, pruned: Callable[[str, list[str]], set[str]]) -> Iterator[tuple[str, os.stat_result]]:
    """Each file under `root` (its path relative to `root`) with its `lstat`, folders that are links
    not entered, nor those `pruned(folder, names)` names; a file gone meanwhile is left out."""
    for folder, dirs, files in os.walk(root):
        left_out = pruned(folder, dirs)
        dirs[:] = [d for d in dirs if d not in left_out and not os.path.islink(os.path.join(folder, d))]
        for name in files:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            yield os.path.relpath(path, root), info


def skip(folder: str, names: list[str]) -> set[str]:
    """Caches and environments, and files that hold no bytes to copy (a named pipe, a socket, a
    device: copying one would block on it or fail)."""
    return {n for n in names if n in SKIPPED or _special(os.path.join(folder, n))}


def _special(path: str) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def links_into_the_copy(root: str, copy: str) -> None:
    """Each symbolic link of the copy names what the user's names, as seen from the copy: a place
    inside the project, its copy (an absolute link would lead a run back into the user's files: its
    checkpoints written there, its imports unedited); a place outside, that place (a relative link
    would lead nowhere from the scratch folder)."""
    for folder, dirs, files in os.walk(copy):
        for name in (*dirs, *files):
            link = os.path.join(folder, name)
            if not os.path.islink(link):
                continue
            target = os.readlink(link)
            real = os.path.realpath(os.path.join(root, os.path.relpath(link, copy)))
            if real == root or real.startswith(os.path.join(root, "")):
                new = os.path.relpath(os.path.join(copy, os.path.relpath(real, root)), folder)
            else:
                new = target if os.path.isabs(target) else real
            if new != target:
                os.unlink(link)
                os.symlink(new, link)
