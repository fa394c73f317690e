"""Stacks: which frames are the user's (the files: `user_files`), capturing them (Python and C++ stacks), and DDP detection."""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import torch

from ... import _compat
from ...causes import WriteForm
from ...sites import Frame, Phase, Site, source_line
from .user_files import PACKAGE_DIR as PACKAGE_DIR
from .user_files import framework_of as framework_of
from .user_files import is_user_file as is_user_file

_WRITE_KERNELS_FILE = os.path.join(PACKAGE_DIR, "trace", "fast", "write_kernels.py")
TORCH_DIR = os.path.join(os.path.dirname(torch.__file__), "")  # torch's own files: never the user's line
_TORCH_MODULES_DIR = os.path.join(torch.nn.modules.__path__[0], "")
# Torch frames that only forward a call (module __call__, decorators): not the API the user called.
_WRAPPER_NAMES = frozenset({"_wrapped_call_impl", "_call_impl", "_fn", "wrapper", "decorate_context"})


def called_by_a_torch_module(frame: FrameType | None) -> bool:
    """Whether the first frame outside torch's functional machinery is a torch.nn module's code:
    an `inplace=True` call a module's flag controls, rather than one the user wrote."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_TORCH_MODULES_DIR):
            return True
        if not filename.startswith(TORCH_DIR):
            return False
        frame = frame.f_back
    return False


def _is_api_name(qualname: str) -> bool:
    return "<locals>" not in qualname and qualname.rsplit(".", 1)[-1] not in _WRAPPER_NAMES


_CHECKPOINT_FILE = os.path.join(os.path.dirname(torch.__file__), "utils", "checkpoint.py")
MAX_STACK = 24  # user frames kept for a write: the line everyone reads first
SAVE_STACK = 8  # user frames kept for a save


RawFrame = tuple[str, int, str]  # (file, line, function): cheap to capture on every save


def capture_frames(limit: int = MAX_STACK) -> tuple[tuple[RawFrame, ...], str | None]:
    """User frames of the current stack (innermost last) and the torch API the innermost one called.

    Plain tuples; `make_site` turns them into `Frame`s only when a finding needs them.
    """
    frames, api, _ = resolve_stack(capture_stack(), limit)
    return frames, api


def capture_stack() -> Any:
    """The whole Python stack, captured in C: code objects and instruction offsets.

    Runs on every saved tensor. About three times cheaper than walking the
    frames in Python, and it keeps no frame (so no local tensor) alive;
    `resolve_stack` reads it only when a finding needs the location. (Hot hooks call
    `stacks.capture` itself, one Python call less.)
    """
    return capture()


class _PythonStack(list):  # type: ignore[type-arg]
    """A stack walked in Python, in the symbolizer's format (innermost first)."""


def _python_stack() -> _PythonStack:
    """The stack from this walk's caller out (the tool's own frames are never a user's line)."""
    entries = _PythonStack()
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        entries.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno, "name": frame.f_code.co_name})
        frame = frame.f_back
    return entries


_native_capture: Callable[[], Any] = functools.partial(_compat.gather_traceback, True, False, False)
#: How a stack is captured: torch's C capture, or, where the program's paths hold a name that
#: is not UTF-8 (torch's symbolizer cannot pass it to C++), the walk in Python.
#: `choose_stack_capture` rebinds it; every capture, inlined or not, calls this one name.
capture: Callable[[], Any] = _native_capture


def _is_utf8(path: object) -> bool:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # surrogate-escaped bytes: the path is not UTF-8
        return False
    return True


def choose_stack_capture() -> None:
    """Walk stacks in Python when the working folder, the import path or the script's path
    holds a name that is not UTF-8 (their files' frames would fail torch's symbolizer)."""
    global capture
    main = sys.modules.get("__main__")
    try:
        cwd = os.getcwd()
    except OSError:  # the working folder was removed
        cwd = ""
    paths = [cwd, *sys.path, *sys.argv[:1], getattr(main, "__file__", "") or ""]
    capture = _native_capture if all(_is_utf8(p) for p in paths) else _python_stack


def resolve_stack(captured: Any, limit: int) -> tuple[tuple[RawFrame, ...], str | None, bool]:
    """`capture_frames`' answer for a `capture_stack()` capture, plus whether it ran inside a checkpointed region."""
    return resolve_stacks([captured], limit)[0]


def resolve_stacks(captured: list[Any], limit: int) -> list[tuple[tuple[RawFrame, ...], str | None, bool]]:
    """`resolve_stack` for many captures at once (torch symbolizes them in one batch)."""
    native = [c for c in captured if not isinstance(c, _PythonStack)]
    try:
        symbolized = iter(_compat.symbolize_tracebacks(native) if native else [])
    except RuntimeError:  # a frame's file name is not UTF-8: those captures lose their lines only
        symbolized = iter([_symbolize_one(c) for c in native])
    return [_select(c if isinstance(c, _PythonStack) else next(symbolized), limit) for c in captured]


def _symbolize_one(captured: Any) -> list[dict[str, Any]]:
    try:
        return _compat.symbolize_tracebacks([captured])[0]
    except RuntimeError:
        return []


def checkpoint_split(captured: Any, limit: int) -> tuple[tuple[RawFrame, ...], str | None, tuple[RawFrame, ...]]:
    """For a capture inside a checkpointed region: the user frames inside the innermost region and the
    torch API the innermost one called, then the user frames that called `checkpoint` (innermost last)."""
    entries = captured if isinstance(captured, _PythonStack) else _symbolize_one(captured)
    for i, entry in enumerate(entries):  # innermost first
        if entry["filename"] == _CHECKPOINT_FILE:
            inner, api, _ = _select(entries[:i], limit)
            return inner, api, _select(entries[i:], limit)[0]
    frames, api, _ = _select(entries, limit)
    return frames, api, ()


class UserFrames(tuple[RawFrame, ...]):
    """The user's frames of a stack (innermost last), the framework of each frame left out
    because an installed framework ran it (`pluggy`, `_pytest`), outermost first, and whether
    the stack ran inside `torch.compile`d code (which the tracer runs eagerly)."""

    hidden: tuple[str, ...] = ()
    in_compiled: bool = False


def _user_frames(frames: list[RawFrame], hidden: list[str], in_compiled: bool = False) -> UserFrames:
    kept = UserFrames(frames)
    if hidden:
        kept.hidden = tuple(hidden)
    if in_compiled:
        kept.in_compiled = True
    return kept


# The wrapper `torch.compile` puts around a function or a module's forward: on the stack while
# compiled code runs (eagerly, under the tracer's `force_eager` stance). Its `_fn` is the wrapper of
# `torch._dynamo.disable`d functions (optimizers, torch's own helpers), not of compiled ones; torch
# releases that name their compile wrapper `_fn` too are not told apart (no note there).
_EVAL_FRAME_FILE = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "eval_frame.py")
_COMPILE_WRAPPERS = frozenset({"compile_wrapper"})


def _select(entries: list[dict[str, Any]], limit: int) -> tuple[UserFrames, str | None, bool]:
    frames: list[RawFrame] = []
    hidden: list[str] = []
    api: str | None = None
    through_checkpoint = in_compiled = False
    for entry in entries:  # innermost first
        filename, line, name = entry["filename"], entry["line"], entry["name"]
        if filename == _CHECKPOINT_FILE:
            through_checkpoint = True
        elif filename == _EVAL_FRAME_FILE and name in _COMPILE_WRAPPERS:
            in_compiled = True
        framework = framework_of(filename)
        if framework is not None:
            hidden.append(framework)
        if len(frames) >= limit:
            continue
        if is_user_file(filename):
            frames.append((filename, line, name))
        elif not frames and filename.startswith(TORCH_DIR):
            qualname = _qualname(filename, name, line)
            if _is_api_name(qualname):
                api = qualname
        elif not frames and filename == _WRITE_KERNELS_FILE:
            api = None  # a write kernel's redispatch: torch called by the tool, not the API the user called
    frames.reverse()
    hidden.reverse()
    return _user_frames(frames, hidden, in_compiled), api, through_checkpoint


# filename -> (first line, last line, name, qualname) of every code object compiled from it
_code_spans: dict[str, list[tuple[int, int, str, str]]] = {}


def _qualname(filename: str, name: str, line: int) -> str:
    """`Linear.forward` for the function `forward` running at `line` of torch/nn/modules/linear.py.

    A captured stack keeps the function's name only; its qualified name comes
    from compiling the file's source once (only when a finding is reported).
    """
    spans = _code_spans.get(filename)
    if spans is None:
        spans = _code_spans[filename] = []
        try:
            todo = [compile("".join(linecache.getlines(filename)), filename, "exec", dont_inherit=True)]
        except (SyntaxError, ValueError):
            todo = []
        while todo:
            code = todo.pop()
            lines = [n for _, _, n in code.co_lines() if n is not None]
            if lines:
                spans.append((min(lines), max(lines), code.co_name, code.co_qualname))
            todo.extend(c for c in code.co_consts if isinstance(c, type(code)))
    inside = [(last - first, qualname) for first, last, n, qualname in spans if n == name and first <= line <= last]
    return min(inside)[1] if inside else name


_INPLACE_CALL = re.compile(r"\b(?P<name>[a-z][a-z0-9_]*_)\(")


def inplace_op_in_traceback(tb: TracebackType | None) -> str | None:
    """The in-place call on the innermost Python line of a traceback (`relu_`), if it shows one."""
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return None
    text = linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno)
    found = _INPLACE_CALL.search(text)
    if found:
        return f"aten.{found['name']}"
    return "aten.add_" if "+=" in text else None


def frames_from_traceback(tb: TracebackType | None) -> tuple[tuple[RawFrame, ...], str | None]:
    """User frames of a traceback, innermost last, and the torch API the innermost one called."""
    frames: list[RawFrame] = []
    hidden: list[str] = []
    api: str | None = None
    after_user = False
    while tb is not None:
        code = tb.tb_frame.f_code
        framework = framework_of(code.co_filename)
        if framework is not None:
            hidden.append(framework)
        if is_user_file(code.co_filename):
            frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            api, after_user = None, True
        elif after_user and code.co_filename.startswith(TORCH_DIR) and _is_api_name(code.co_qualname):
            api, after_user = code.co_qualname, False
        tb = tb.tb_next
    return _user_frames(frames[-MAX_STACK:], hidden), api




def _torch_file(module: str) -> str | None:
    """The file of torch's `module`, found without importing it (DDP and FSDP import torch._dynamo: ~0.8 s
    at every start of the tool); None where this torch has no such file (built without distributed)."""
    path = os.path.join(TORCH_DIR, *module.split(".")[1:]) + ".py"
    return path if os.path.isfile(path) else None


# Code of frameworks that overwrites parameters or buffers on purpose, file -> its functions:
# DistributedDataParallel's methods under `torch.autograd.graph._unsafe_preserve_version_counter`
# (buffer broadcast at each forward, parameter sync at construction), which PyTorch hides from
# autograd by design; FSDP2's copy-outs (`fsdp::split_with_sizes_copy` refills the unsharded
# parameters before backward with the values forward used, `fsdp::chunk_cat` fills gradient
# buffers): the fast tracer sees the aten ops inside them, not the `fsdp::` op.
_SYNC_FUNCTIONS = {
    file: functions
    for file, functions in (
        (_torch_file("torch.nn.parallel.distributed"), frozenset({
            "_sync_buffers", "_sync_module_buffers", "_default_broadcast_coalesced",
            "_distributed_broadcast_coalesced", "_sync_params_and_buffers", "_broadcast_coalesced",
        })),
        (_torch_file("torch.distributed.fsdp._fully_shard._fsdp_collectives"),
         frozenset({"split_with_sizes_copy", "chunk_cat"})),
    )
    if file is not None
}


def in_framework_state_sync() -> bool:
    """Whether DistributedDataParallel's or FSDP2's own writes of parameters, buffers or their
    gradients are on the stack (`_SYNC_FUNCTIONS`).

    Called for every write: outside an initialised process group (where they
    cannot run) it answers without walking the stack.
    """
    if not _SYNC_FUNCTIONS or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        code = f.f_code
        functions = _SYNC_FUNCTIONS.get(code.co_filename)
        if functions is not None and code.co_name in functions:
            return True
        f = f.f_back
    return False


def checkpoint_in_traceback(tb: TracebackType | None) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _CHECKPOINT_FILE:
            return True
        tb = tb.tb_next
    return False


def make_site(
    op: str,
    raw_frames: tuple[RawFrame, ...],
    api: str | None,
    module: tuple[str, int, str, bool | None] | None,
    phase: str,
    origin: Frame | None = None,
    form: WriteForm | None = None,
) -> Site:
    """A Site for `op` from captured frames; `phase` is "forward" or "backward"."""
    frames = tuple(Frame(*raw) for raw in raw_frames)
    inner = frames[-1] if frames else None
    return Site(
        op=op,
        module=module[0] if module else None,
        module_call=module[1] if module else None,
        module_type=module[2] if module else None,
        module_inplace=module[3] if module else None,
        file=inner.file if inner else None,
        line=inner.line if inner else None,
        code=source_line(inner),
        stack=frames,
        api=api,
        phase=Phase(phase),
        origin=origin,
        form=form,
        hidden_frames=getattr(raw_frames, "hidden", ()),
        in_compiled=getattr(raw_frames, "in_compiled", False),
    )
