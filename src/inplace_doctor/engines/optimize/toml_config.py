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
dots); later entries override earlier ones. `apply_config` refuses a pattern
that matches no module with an `inplace` option, and warns when it sets a
module the traced run never executed (its decision rests on no evidence).
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import warnings
from typing import Any, Mapping

import tomllib
import torch

from ...errors import UsageError

HEADER_TABLE = "inplace-doctor"


def inplace_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module path -> module, for every module with a boolean `inplace` option."""
    return {
        name: m for name, m in model.named_modules() if isinstance(m.__dict__.get("inplace"), bool)
    }


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The TOML file at `path`; `UsageError` naming `what` and the problem on any file that is not
    readable UTF-8 TOML (missing, a folder, unreadable, another encoding, a syntax error)."""
    name = repr(os.fspath(path))
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{what} {name} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {name} is a folder; give the path of the .toml file in it") from None
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{what} {name} is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start}); "
            "TOML files must be UTF-8: re-save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{what} {name} is not valid TOML: {e}") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {name}: {e.strerror or e}") from None


def load_config(path: str | os.PathLike[str]) -> tuple[dict[str, bool], dict[str, Any]]:
    """(pattern -> flag, header) from a config file; UsageError on a file that is not one."""
    data = read_toml(path, "config file")
    unknown = sorted(set(data) - {"inplace", HEADER_TABLE})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["inplace", HEADER_TABLE], n=1)
        hint = f"; did you mean [{close[0]}]?" if close else f"; expected [inplace] and [{HEADER_TABLE}]"
        raise UsageError(f"config file {os.fspath(path)!r}: unknown table [{unknown[0]}]{hint}")
    table = data.get("inplace", {})
    if not isinstance(table, dict):
        raise UsageError(f"config file {os.fspath(path)!r}: [inplace] must be a table of \"module.path\" = true/false")
    for key, value in table.items():
        if not isinstance(value, bool):
            raise UsageError(
                f"config file {os.fspath(path)!r}: {key!r} = {value!r}; each entry must be true or false"
            )
    return dict(table), dict(data.get(HEADER_TABLE, {}))


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
        table = dict(config)
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


def _glob_of(path: str) -> str:
    """`layer1.0.relu` -> `layer*.*.relu`: numbers become wildcards."""
    out, digits = [], False
    for ch in path:
        if ch.isdigit():
            if not digits:
                out.append("*")
            digits = True
        else:
            out.append(ch)
            digits = False
    return "".join(out)


def compress(decisions: Mapping[str, bool], all_paths: list[str]) -> list[tuple[str, bool, list[str]]]:
    """Group paths under a numeric glob when every module it matches gets the same flag.

    Returns (pattern, flag, the paths it stands for), in first-path order.
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
            out.append((path, decisions[path], [path]))
            done.add(path)
    return out


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
