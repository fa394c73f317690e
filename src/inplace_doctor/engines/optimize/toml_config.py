"""The in-place config file: TOML keyed by module path (globs allowed), reviewable in a PR.

    # inplace-doctor in-place config ...
    [inplace-doctor]
    inputs = ["2x3x224x224:float32"]
    mode = "train"
    never-executed = ["aux.relu"]

    [inplace]
    "layer*.*.relu" = true
    "features.3" = false     # unsafe: IPD101 ...

Patterns are `fnmatch` globs over `named_modules()` paths (`*` also crosses
dots); later entries override earlier ones. A module whose name holds a glob
character is named with it bracketed (`"blocks[[]0]"` is `blocks[0]`), as
`optimize --write` writes it. `apply_config` refuses, before changing anything,
a pattern that matches no module with an `inplace` option and a value that is
not a boolean (file or mapping alike), and warns when it sets a module the
traced run never executed (its decision rests on no evidence).
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import stat
import tomllib
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import UsageError

HEADER_TABLE = "inplace-doctor"


def inplace_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module path -> module, for every module with a boolean `inplace` option."""
    return {
        name: m for name, m in model.named_modules() if isinstance(m.__dict__.get("inplace"), bool)
    }


CONFIG_LIMIT = 4 << 20  # a config or pyproject.toml larger than this is not one


def read_config_text(path: str | os.PathLike[str], what: str, *, strict: bool = True) -> str:
    """The text of the regular file at `path`, at most `CONFIG_LIMIT` bytes; `UsageError` naming
    `what` otherwise. A pipe or a device is refused unread (`/dev/zero` would never end)."""
    name = repr(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise UsageError(f"{what} {name} does not exist") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {name}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode  # of what was opened, so a file swapped for a FIFO is still caught
        if stat.S_ISDIR(mode):
            raise UsageError(f"{what} {name} is a folder; give the path of the .toml file in it")
        if not stat.S_ISREG(mode):
            kind = "a named pipe" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
            raise UsageError(f"{what} {name} is {kind}, not a file; give the path of a .toml file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(CONFIG_LIMIT + 1)
    except OSError as e:
        raise UsageError(f"cannot read {what} {name}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > CONFIG_LIMIT:
        raise UsageError(f"{what} {name} is larger than {CONFIG_LIMIT >> 20} MiB, more than any config; give the path of a .toml file")
    try:
        return data.decode("utf-8", "strict" if strict else "surrogateescape")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} {name} is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start}); "
            "TOML files must be UTF-8: re-save it as UTF-8"
        ) from None


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The TOML file at `path`; `UsageError` naming `what` and the problem on any file that is not
    readable UTF-8 TOML (missing, a folder, a pipe or device, too large, unreadable, another
    encoding, a syntax error, arrays nested too deep to parse)."""
    text = read_config_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{what} {repr(os.fspath(path))} is not valid TOML: {e}") from None
    except RecursionError:  # tomllib reads the whole file, other tools' tables too, recursively
        raise UsageError(
            f"{what} {repr(os.fspath(path))} cannot be read: its arrays or inline tables nest deeper than Python's "
            "TOML reader can go (RecursionError; every table is read, other tools' too); nest them less deeply"
        ) from None


def write_atomically(path: str, text: str) -> None:
    """`text` in a temporary file in `path`'s folder, then renamed over `path`: a reader sees the
    old file or the whole new one, and a failed write leaves the old one as it was."""
    import secrets

    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.inplace-doctor.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            if os.path.exists(path):
                os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode))
            f.write(text)
            f.flush()
            os.fsync(fd)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


# The header keys `optimize --write` writes, and the type each must have (the header records what
# the config was derived from; only `never-executed` is read back, but every known key is checked
# so that a hand-mangled header is named, not half-trusted).
HEADER_KEYS: dict[str, tuple[str, str]] = {
    "target": ("str", "a string"),
    "inputs": ("list[str]", "an array of strings"),
    "mode": ("str", "a string"),
    "optimizer": ("str", "a string"),
    "torch": ("str", "a string"),
    "peak-shipped-bytes": ("int", "an integer"),
    "peak-planned-bytes": ("int", "an integer"),
    "verified": ("bool", "true or false"),
    "never-executed": ("list[str]", "an array of module paths (strings)"),
}


def toml_type(value: Any) -> str:
    """What a parsed TOML value is, in TOML's words, with the value: `an integer (5)`."""
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array", dict: "a table"}
    name = names.get(type(value), f"a {type(value).__name__}")
    shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return f"{name} ({shown})"


def _has_type(value: Any, kind: str) -> bool:
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return type(value) is {"str": str, "int": int, "bool": bool}[kind]  # `is`: true is not an integer here


def load_config(path: str | os.PathLike[str]) -> tuple[dict[str, bool], dict[str, Any]]:
    """(pattern -> flag, header) from a config file; UsageError naming the key and the type it
    needs on a file that is not one."""
    data = read_toml(path, "config file")
    where = f"config file {os.fspath(path)!r}"
    unknown = sorted(set(data) - {"inplace", HEADER_TABLE})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["inplace", HEADER_TABLE], n=1)
        hint = f"; did you mean [{close[0]}]?" if close else f"; expected [inplace] and [{HEADER_TABLE}]"
        raise UsageError(f"{where}: unknown table [{unknown[0]}]{hint}")
    table = data.get("inplace", {})
    if not isinstance(table, dict):
        raise UsageError(
            f"{where}: inplace must be a table, [inplace] with \"module.path\" = true/false, not {toml_type(table)}"
        )
    header = data.get(HEADER_TABLE, {})
    if not isinstance(header, dict):
        raise UsageError(
            f"{where}: {HEADER_TABLE} must be a table, [{HEADER_TABLE}] as optimize --write writes it, "
            f"not {toml_type(header)}"
        )
    for key, (kind, words) in HEADER_KEYS.items():
        if key in header and not _has_type(header[key], kind):
            raise UsageError(f"{where}: [{HEADER_TABLE}] {key} must be {words}, not {toml_type(header[key])}")
    return checked_flags(table, where), dict(header)


def checked_flags(table: Mapping[Any, Any], where: str) -> dict[str, bool]:
    """`table` as module pattern -> flag; UsageError on the first key that is not a string or
    value that is not a bool (the string "false" is truthy: it would turn the flag on)."""
    for key, value in table.items():
        if not isinstance(key, str):
            raise UsageError(f"{where}: key {key!r} is {toml_type(key)}; keys are module paths (strings), e.g. 'layer1.0.relu'")
        if isinstance(value, dict) and value:  # `layer1.relu = true`: TOML reads a dotted key as tables
            inner, flag = _first_leaf(key, value)
            raise UsageError(
                f"{where}: {key!r} is a table: TOML reads an unquoted dotted key as nested tables; quote the "
                f"module path: {toml_string(inner)} = {toml_value(flag)}"
            )
        if not isinstance(value, bool):
            raise UsageError(
                f"{where}: {key!r} is {toml_type(value)}; each entry must be true or false (True or False in Python)"
            )
    return dict(table)


def apply_config(
    model: torch.nn.Module,
    config: str | os.PathLike[str] | Mapping[str, bool],
    *,
    never_executed: list[str] | None = None,
) -> dict[str, bool]:
    """Set the `inplace` flags of `model`'s modules from a config file or mapping.

    Returns the flags that changed (path -> new value). Raises UsageError, before
    changing anything, for a pattern that matches no module with an `inplace`
    option; warns (UserWarning) for a module the traced run never executed.
    """
    header: dict[str, Any] = {}
    if isinstance(config, Mapping):
        table = checked_flags(config, "apply_config mapping")
    elif isinstance(config, (str, os.PathLike)):
        table, header = load_config(config)
    else:  # an int would be opened as a file descriptor (and closed): refuse anything else by name
        raise UsageError(
            f"apply_config needs a config file path (str or os.PathLike) or a mapping of module path -> bool, "
            f"got {type(config).__name__}"
        )
    skipped = set(never_executed if never_executed is not None else header.get("never-executed", []))
    modules = inplace_modules(model)
    plan: dict[str, bool] = {}
    for pattern, flag in table.items():
        hits = [name for name in modules if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise UsageError(_no_match(pattern, model, modules))
        for name in hits:
            plan[name] = flag
    unexercised = sorted(name for name in plan if name in skipped)
    if unexercised:
        warnings.warn(
            f"the config sets {len(unexercised)} module(s) the traced run never executed, so their "
            f"decision rests on no evidence: {', '.join(unexercised[:5])}"
            + (" ..." if len(unexercised) > 5 else ""),
            UserWarning,
            stacklevel=2,
        )
    changed = {}
    for name, flag in plan.items():
        module = modules[name]
        if module.inplace is not flag:
            setattr(module, "inplace", flag)  # noqa: B010 (Module.__setattr__ is typed for tensors and modules)
            changed[name] = flag
    return changed


def _no_match(pattern: str, model: torch.nn.Module, modules: dict[str, torch.nn.Module]) -> str:
    everything = [name for name, _ in model.named_modules() if name]
    if pattern in modules:  # a name with glob characters, written as it is: its brackets are a set
        return (
            f"config entry {pattern!r} matches no module of {type(model).__name__}: `*`, `?` and `[` are glob "
            f"characters; to name the module {pattern!r} itself write {glob_escape(pattern)!r}"
        )
    if any(fnmatch.fnmatchcase(name, pattern) for name in everything):
        return (
            f"config entry {pattern!r} matches only modules without an `inplace` option; "
            f"modules that have one: {', '.join(list(modules)[:6]) or 'none'}"
        )
    close = difflib.get_close_matches(pattern, list(modules) or everything, n=1)
    if close:
        hint = f"; did you mean {close[0]!r}?"
    elif modules:  # nothing close: the paths that can be set, so the right one can be picked
        names = list(modules)
        hint = f"; the modules with an `inplace` option are {', '.join(names[:6])}" + (
            f" ... ({len(names)} in all)" if len(names) > 6 else ""
        )
    else:
        hint = "; no module of it has an `inplace` option, so there is nothing to configure"
    return f"config entry {pattern!r} matches no module of {type(model).__name__}{hint}"


def _first_leaf(path: str, table: dict[str, Any]) -> tuple[str, Any]:
    """(`layer1.relu`, True) from {"relu": True} under `layer1`: the first dotted path down to a value."""
    key, value = next(iter(table.items()))
    path = f"{path}.{key}"
    return _first_leaf(path, value) if isinstance(value, dict) and value else (path, value)


def toml_value(value: Any) -> str:
    """A parsed TOML scalar written back: true, 5, "text"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return toml_string(value) if isinstance(value, str) else repr(value)


GLOB_CHARACTERS = "*?["


def glob_escape(path: str) -> str:
    """`blocks[0]` -> `blocks[[]0]`: a pattern that matches exactly the module named `path`
    (`*`, `?` and `[` bracketed; `]` outside brackets is already literal)."""
    return "".join(f"[{ch}]" if ch in GLOB_CHARACTERS else ch for ch in path)


def _glob_of(path: str) -> str:
    """`layer1.0.relu` -> `layer*.*.relu`: numbers become wildcards, glob characters are escaped."""
    out, digits = [], False
    for ch in path:
        if ch.isdigit():
            if not digits:
                out.append("*")
            digits = True
        else:
            out.append(glob_escape(ch))
            digits = False
    return "".join(out)


def compress(decisions: Mapping[str, bool], all_paths: list[str]) -> list[tuple[str, bool, list[str]]]:
    """Group paths under a numeric glob when every module it matches gets the same flag.

    Returns (pattern, flag, the paths it stands for), in first-path order; a path left alone
    comes back as a pattern matching exactly it (`glob_escape`).
    """
    groups: dict[str, list[str]] = {}
    for path in decisions:
        groups.setdefault(_glob_of(path), []).append(path)
    out: list[tuple[str, bool, list[str]]] = []
    done: set[str] = set()
    for path in decisions:
        if path in done:
            continue
        pattern = _glob_of(path)
        members = groups[pattern]
        matched = [p for p in all_paths if fnmatch.fnmatchcase(p, pattern)]
        flags = {decisions[p] for p in members}
        if len(members) > 1 and len(flags) == 1 and set(matched) == set(members):
            out.append((pattern, decisions[path], members))
            done.update(members)
        else:
            out.append((glob_escape(path), decisions[path], [path]))
            done.add(path)
    return out


# TOML basic strings take no control character but tab; these have short escapes, the rest \uXXXX.
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(value: str) -> str:
    """`value` as a TOML basic string that reads back as exactly `value` (newlines and other
    control characters escaped)."""
    out = []
    for ch in value:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_comment(text: str) -> str:
    """`text` on one comment line: a newline or other control character would end the comment
    and leave the rest as (invalid) TOML."""
    return "".join(" " if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in text)
