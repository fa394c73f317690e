"""`[tool.inplace-doctor]` in pyproject.toml, found by walking up from the working directory.

    [tool.inplace-doctor]
    select = ["IPD1"]                 # codes or prefixes (default: every rule)
    ignore = ["IPD104"]
    fail-on = "warning"               # error | warning | info | never
    per-module-ignores = { "model.backbone.*" = ["IPD105"] }

Command-line flags override the file: `--select`/`--ignore` replace its lists,
`--fail-on` its threshold. Unknown keys and codes are a UsageError naming the
closest valid one; a value of the wrong type (`tool = "x"`, `inplace-doctor = 5`,
`fail-on = 5`) one naming the key and the type it needs.
"""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines.optimize.toml_config import read_toml, toml_type
from ..errors import UsageError
from ..findings import Severity

KEYS = ("select", "ignore", "fail-on", "per-module-ignores")
FAIL_ON = ("error", "warning", "info", "never")


@dataclass
class ProjectConfig:
    select: list[str] | None = None
    ignore: list[str] | None = None
    fail_on: str = "warning"
    per_module_ignores: dict[str, list[str]] = field(default_factory=dict)
    path: str | None = None  # the pyproject.toml it came from

    def fail_severity(self) -> Severity | None:
        """The least severity that fails the run; None for `never`."""
        return None if self.fail_on == "never" else Severity(self.fail_on)


def find_pyproject(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest `pyproject.toml` from `start` up: the first name that exists, whatever it is (a
    FIFO, a device, a link to one or to nothing is that project's file too, and refused when read:
    walking past it would take another project's settings)."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if os.path.lexists(candidate):
            return candidate
    return None


def _refuse_unreadable(path: Path) -> None:
    """A project file that is not a regular file: one line naming it, unread (a FIFO would block, a
    device never end), found with `stat`, which opens nothing."""
    linked = f", a symbolic link to {os.readlink(path)!r}," if path.is_symlink() else ""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        what = f"cannot be followed ({e.strerror})" if linked else f"cannot be read ({e.strerror})"
        raise UsageError(f"project file {str(path)!r}{linked} {what}, so its [tool.inplace-doctor] settings are "
                         "unknown and nothing ran: point it at a readable file (or remove it)") from None
    if stat.S_ISREG(mode):
        return
    kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")
    raise UsageError(
        f"project file {str(path)!r}{linked} is {kind}, not a file, so its [tool.inplace-doctor] settings are "
        "unknown and nothing ran: make it a regular file (or remove it), or run from outside that project"
    )


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(choices)}"


def _code_list(value: Any, key: str, where: str) -> list[str]:
    from ..rules import select_rules

    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: {key} must be a list of rule codes, e.g. [\"IPD105\"], not {toml_type(value)}")
    try:
        select_rules(value)
    except UsageError as e:
        raise UsageError(f"{where}: {key}: {e}") from None
    return list(value)


def load_project_config(start: str | os.PathLike[str] | None = None) -> ProjectConfig:
    """The `[tool.inplace-doctor]` table of the nearest pyproject.toml (defaults without one)."""
    path = find_pyproject(start)
    if path is None:
        return ProjectConfig()
    _refuse_unreadable(path)
    data = read_toml(path, "project file")
    table = _tool_table(data, path)
    if table is None:
        return ProjectConfig(path=str(path))
    where = f"{path} [tool.inplace-doctor]"
    for key in table:
        if key not in KEYS:
            raise UsageError(f"{where}: unknown key {key!r}; {_did_you_mean(key, KEYS)}")
    config = ProjectConfig(path=str(path))
    if "select" in table:
        config.select = _code_list(table["select"], "select", where)
    if "ignore" in table:
        config.ignore = _code_list(table["ignore"], "ignore", where)
    if "fail-on" in table:
        if not isinstance(table["fail-on"], str):
            raise UsageError(f"{where}: fail-on must be one of the strings {', '.join(FAIL_ON)}, not {toml_type(table['fail-on'])}")
        value = table["fail-on"].lower()
        if value not in FAIL_ON:
            raise UsageError(f"{where}: fail-on = {table['fail-on']!r}; {_did_you_mean(value, FAIL_ON)}")
        config.fail_on = value
    if "per-module-ignores" in table:
        pmi = table["per-module-ignores"]
        if not isinstance(pmi, dict):
            raise UsageError(
                f"{where}: per-module-ignores must be a table of \"module.glob\" = [codes], not {toml_type(pmi)}"
            )
        config.per_module_ignores = {
            str(glob): _code_list(codes, f"per-module-ignores[{glob!r}]", where) for glob, codes in pmi.items()
        }
    return config


def _tool_table(data: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """`[tool.inplace-doctor]` of a parsed pyproject.toml (None without one); UsageError naming
    the key when `tool` or `inplace-doctor` is not a table (`tool = "x"`, `inplace-doctor = 5`)."""
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise UsageError(f"{path}: tool must be a table ([tool.inplace-doctor] and other tools' settings), not {toml_type(tool)}")
    table = tool.get("inplace-doctor")
    if table is not None and not isinstance(table, dict):
        raise UsageError(
            f"{path}: tool.inplace-doctor must be a table, [tool.inplace-doctor] with keys such as "
            f"ignore = [\"IPD104\"], not {toml_type(table)}"
        )
    return table


def merged(config: ProjectConfig, select: list[str] | None, ignore: list[str] | None, fail_on: str | None) -> ProjectConfig:
    """The file's settings with command-line flags (when given) taking precedence."""
    if fail_on is not None and fail_on.lower() not in FAIL_ON:
        raise UsageError(f"--fail-on {fail_on!r}; {_did_you_mean(fail_on.lower(), FAIL_ON)}")
    return ProjectConfig(
        select=select or config.select,
        ignore=ignore or config.ignore,
        fail_on=(fail_on or config.fail_on).lower(),
        per_module_ignores=dict(config.per_module_ignores),
        path=config.path,
    )
