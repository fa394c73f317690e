"""A proof run changes nothing outside its copy of the project (issue 38, item 4).

`fix` and `run --prove` run the user's program again in scratch copies (`prove.py`); a write to
an absolute path (`torch.save(m, "/data/ckpt.pt")`, a log under `~`) would land in the user's
real files from a run whose edit may then not even be applied. `Confined` (installed once in a
proof child, `recorder.py`) is a PEP 578 audit hook: every write the process asks for (`open` in a
write mode or with write flags, `os.open`, rename, replace, remove, rmdir, mkdir, truncate, chmod,
links, `shutil.rmtree`) is allowed inside the copy, the run's own temporary folder (`TMPDIR`
points there) and `/dev`, and refused elsewhere with a `PermissionError` before a byte changes.
A program the user runs is its own business; one the program starts is not confined by this
process, so starting one (`subprocess`, `os.system`, `os.exec*`, `os.posix_spawn`) from the
program's own code is refused the same way (a library's own helper, such as `ctypes.util`
asking `ldconfig`, is let through: it writes nothing). What was refused is recorded: `judge`
then calls the fix not provable and names the first path, never a silent success.

Audit hooks cannot be removed; the proof child is a process of its own, so that is its whole
life. Writes the hook cannot see (a C library writing through its own `fopen`) are not refused.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from ...trace.places.user_files import is_user_file

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# event -> positions of the paths it changes (audit events of CPython 3.11, sys.audit's table)
_PATH_EVENTS: dict[str, tuple[int, ...]] = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.truncate": (0,),
    "os.chmod": (0,), "os.chown": (0,), "os.link": (1,), "os.symlink": (1,), "os.utime": (0,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (1,),
    "os.setxattr": (0,), "os.removexattr": (0,),
}
_STARTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile"})
_MAX_KEPT = 8  # refusals recorded: the first says what the proof needs to say


class Confined:
    """The audit hook (module docstring): `allowed` folders (and files) may be written; `refused`
    holds (what, path or command) of each refusal, the first few."""

    def __init__(self, allowed: list[str]) -> None:
        self.allowed = tuple(os.path.realpath(p) for p in allowed if p)
        self.refused: list[tuple[str, str]] = []
        self._busy = False

    def install(self) -> None:
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self._busy:  # the hook's own calls (realpath reads links) are not the program's
            return
        self._busy = True
        try:
            refusal = self._refusal(event, args)
        finally:
            self._busy = False
        if refusal is not None:
            what, path = refusal
            if len(self.refused) < _MAX_KEPT:
                self.refused.append((what, path))
            raise PermissionError(errno.EACCES, "inplace-doctor: a proof run changes nothing outside its copy of "
                                  "the project", path)

    def _refusal(self, event: str, args: tuple[Any, ...]) -> tuple[str, str] | None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else (
                isinstance(flags, int) and flags != -1 and bool(flags & _WRITE_FLAGS))
            return self._outside("writes", path) if writes else None
        positions = _PATH_EVENTS.get(event)
        if positions is not None:
            for i in positions:
                found = self._outside("writes", args[i] if i < len(args) else None)
                if found is not None:
                    return found
            return None
        if event in _STARTS and _from_the_program():
            command = args[1] if event == "subprocess.Popen" and len(args) > 1 else (args[0] if args else "")
            shown = " ".join(map(str, command)) if isinstance(command, (list, tuple)) else str(command)
            return ("starts", shown[:120])
        return None

    def _outside(self, what: str, path: Any) -> tuple[str, str] | None:
        if isinstance(path, int) or path is None:  # a file descriptor: opened earlier, checked then
            return None
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        if real == "/dev" or real.startswith("/dev/"):
            return None
        if any(real == a or real.startswith(os.path.join(a, "")) for a in self.allowed):
            return None
        return (what, real)


def _from_the_program() -> bool:
    """Whether the innermost frame outside the standard library is the user's (not a library's helper)."""
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        library = "site-packages" in name or "dist-packages" in name
        if library or not (name.startswith(_STDLIB) or name.startswith("<frozen")):
            return is_user_file(name) and not name.startswith(_HERE)
        frame = frame.f_back  # type: ignore[assignment]
    return False


_STDLIB = os.path.dirname(os.__file__)
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the tool's own package
