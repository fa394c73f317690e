"""Where an op ran (records): the user's source line, the module path, the torch API called, and how to name them."""

from __future__ import annotations

import enum
import linecache
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class WriteForm(enum.StrEnum):
    """How Python code asked for an in-place op that is not an `op_` call: `Site.form`."""

    FLAG = "inplace=True"                      # `nn.ReLU(inplace=True)`, `F.relu(x, inplace=True)`
    AUGMENTED = "augmented assignment"         # `x += y`


class Phase(enum.StrEnum):
    """When an op ran: the forward (and optimizer code around it) or autograd's backward."""

    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass(frozen=True)
class Frame:
    """One frame of user code."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    @property
    def location(self) -> str:
        """`file:line` as sites print it (relative to the working directory when close)."""
        return f"{_short_path(self.file)}:{self.line}"


@dataclass(frozen=True)
class Site:
    """Where an op ran.

    `file`/`line`/`code` are the innermost frame outside torch, the Python
    standard library and inplace_doctor; `stack` holds every such user frame,
    innermost last. `api` is the torch callable that user line entered
    (`SGD.step`, `ReLU.forward`), when there is one.
    """

    op: str
    module: str | None = None
    module_call: int | None = None
    module_type: str | None = None
    module_inplace: bool | None = None
    file: str | None = None
    line: int | None = None
    code: str | None = None
    stack: tuple[Frame, ...] = field(default=(), compare=False)
    api: str | None = None
    phase: Phase = Phase.FORWARD  # a plain "forward"/"backward" string compares equal
    #: where the running module (one with an `inplace` flag) was constructed: what a flag fix edits
    origin: Frame | None = field(default=None, compare=False)
    #: how Python asked for the write when it is no `op_` call: an `inplace=True` flag or `x += y`
    form: WriteForm | None = None
    #: the framework of each frame left out of `stack` because an installed framework ran it
    #: (pytest, pluggy, Lightning's loop), outermost first
    hidden_frames: tuple[str, ...] = field(default=(), compare=False)
    #: ran inside `torch.compile`d code, which the tracer runs eagerly (compiled, it may behave otherwise)
    in_compiled: bool = field(default=False, compare=False)

    @property
    def origin_location(self) -> str | None:
        return self.origin.location if self.origin is not None else None

    @property
    def location(self) -> str:
        if self.file is None:
            return "<unknown location>"
        return f"{_short_path(self.file)}:{self.line}"

    def to_dict(self) -> dict[str, object]:
        return {
            "op": self.op,
            "form": str(self.form) if self.form is not None else None,
            "module": self.module,
            "module_call": self.module_call,
            "module_type": self.module_type,
            "file": self.file,
            "line": self.line,
            "code": self.code,
            "api": self.api,
            "phase": self.phase,
            "stack": [{"file": f.file, "line": f.line, "function": f.function} for f in self.stack],
            "origin": (
                {"file": self.origin.file, "line": self.origin.line, "function": self.origin.function}
                if self.origin is not None else None
            ),
            "module_inplace": self.module_inplace,
            "hidden_frames": list(self.hidden_frames),
            "in_compiled": self.in_compiled,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Site:
        """The site `to_dict` wrote (a report read back in another process)."""
        origin = data.get("origin")
        return cls(
            op=data["op"], module=data.get("module"), module_call=data.get("module_call"),
            module_type=data.get("module_type"), module_inplace=data.get("module_inplace"), file=data.get("file"),
            line=data.get("line"), code=data.get("code"),
            stack=tuple(Frame(f["file"], f["line"], f["function"]) for f in data.get("stack") or ()),
            api=data.get("api"), phase=Phase(data.get("phase") or Phase.FORWARD),
            origin=Frame(origin["file"], origin["line"], origin.get("function", "")) if origin else None,
            form=WriteForm(data["form"]) if data.get("form") else None,
            hidden_frames=tuple(data.get("hidden_frames") or ()), in_compiled=bool(data.get("in_compiled")),
        )


ROOT_LABEL = "model"  # what reports call the audited model: `model.layer1.0.relu`


def module_path(path: str, root_label: str = ROOT_LABEL) -> str:
    """`layer1.0` -> `model.layer1.0`; the root module itself (path "") is `model`."""
    return f"{root_label}.{path}" if path else root_label


def module_ref(site: Site, root_label: str) -> str | None:
    """The module as the user would write it: `model.layer1.0.relu`."""
    if site.module is None:
        return None
    if not root_label:
        return site.module or "<root module>"
    return module_path(site.module, root_label)


def describe_site(site: Site, root_label: str, slot: str | None = None) -> str:
    """`relu_` (via SGD.step) in model.features.3 (ReLU, call 2) at model.py:42."""
    what = f"`{site.op.removeprefix('aten.')}" + (f" ({site.form})`" if site.form is not None else "`")
    if slot:
        what += f" -> {slot}"
    parts = [what]
    if site.api and not site.api.endswith("forward"):
        parts.append(f"(via {site.api})")
    ref = module_ref(site, root_label)
    if ref is not None:
        extra = [site.module_type] if site.module_type else []
        if site.module_call and site.module_call > 1:
            extra.append(f"call {site.module_call}")
        parts.append(f"in {ref}" + (f" ({', '.join(extra)})" if extra else ""))
    parts.append(f"at {site.location}")
    if site.phase != Phase.FORWARD:
        parts.append(f"during {site.phase}")
    return " ".join(parts)


def _short_path(path: str) -> str:
    marker = os.sep + "site-packages" + os.sep
    if marker in path:  # an installed package: its import path reads best
        return path.rsplit(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(".." + os.sep + "..") else rel


def caller_frame(site: Site) -> Frame | None:
    """The frame that called into the site's innermost one from other code (the training script's
    line): the first outer user frame in another file, else the direct caller; None without one."""
    if len(site.stack) < 2:
        return None
    inner = site.stack[-1]
    return next((f for f in reversed(site.stack[:-1]) if f.file != inner.file), site.stack[-2])


def source_line(frame: Frame | None) -> str | None:
    if frame is None:
        return None
    text = linecache.getline(frame.file, frame.line).strip()
    return text or None


def write_stack(site: Site) -> str:
    """The write's user frames as Python prints a traceback (most recent call last)."""
    lines = [f"the in-place write `{site.op.removeprefix('aten.')}` ran here (most recent call last):"]
    if site.hidden_frames:
        lines.append(_hidden_frames(site.hidden_frames))
    for frame in site.stack:
        lines.append(f'  File "{frame.file}", line {frame.line}, in {frame.function}')
        text = source_line(frame)
        if text:
            lines.append(f"    {text}")
    return "\n".join(lines)


def _hidden_frames(hidden: tuple[str, ...]) -> str:
    """Stands for the frames of installed frameworks left out of a write's traceback."""
    names = ", ".join(dict.fromkeys(hidden))
    return f"  [{len(hidden)} frame{'s' if len(hidden) != 1 else ''} of {names} not shown: the framework's own code]"
