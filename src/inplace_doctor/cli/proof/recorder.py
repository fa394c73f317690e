"""What a program computed, step by step, as exact fingerprints: the evidence `fix` compares.

`Recorder` is a context manager that reads (never changes) a running program:
- the output of each call of a top-level module (one no other module's forward
  is running around), and its buffers after it;
- at each `torch.autograd.backward` (and so `Tensor.backward`): the root
  tensors, and the gradient the pass adds to each leaf of the graph;
- at each optimizer step: the gradients it is about to use, then the
  parameters and the optimizer's state after it;
- at the end: the parameters and buffers of those modules.
Each value is a fingerprint of its bytes (`trace/saves/fingerprint.py`: bit-exact),
in its stream, with a label that says it in words, in order. The streams (each top-level module's
calls, the backward passes of each line that calls backward, each optimizer's steps, the end) are
compared one by one, so moving an optimizer step past a backward, or one update (its backward and
step) before another, reorders nothing that is compared. Labels name a parameter as the program
does (`critic.0.weight`: the name the user's code gives its top-level module, then the parameter's).

Run as `python -m inplace_doctor.cli.proof.recorder --record OUT [--reference] [--reach FILE:L1,L2 ...]
[--allow FOLDER ...] -- ARGS`: without `--reference`, ARGS are `inplace-doctor run`'s, and the
script runs watched; with it, ARGS are `SCRIPT [ARGS ...]` and the script runs
as `python` would, except that every tensor autograd saves is copied at save
(a pack hook returning a copy). That run is the program the user meant:
backward computes the gradient of the forward as it ran, and autograd's own
version check is off (PYTORCH_FACTS.md, "The program the user meant").
Either way the run writes only inside its working directory (the copy) and the `--allow` folders
(`confine.py`), and records which `--reach` groups of lines it ran (`reach.py`).
Either way the run starts from the same seeds (`proof_seeds.py`; the program's own seeding wins),
and the record names the first of its own lines that read what seeds do not fix (the clock,
`os.urandom`, `uuid`, the network).
"""

from __future__ import annotations

import hashlib
import json
import linecache
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

from ...trace.places.user_files import is_user_file
from ...trace.places.user_names import variable_name
from ...trace.saves.fingerprint import fingerprint
from .confine import Confined
from .proof_seeds import Unseeded, seed
from .prove import How
from .reach import Reach


def digest(t: torch.Tensor) -> str:
    """A short exact fingerprint of `t`'s bytes, with its dtype and shape."""
    fp = fingerprint(t.detach())
    body = hashlib.blake2b(repr(fp).encode(), digest_size=8).hexdigest() if fp is not None else "unreadable"
    return f"{_kind(t)}:{body}"


def _kind(t: torch.Tensor) -> str:
    """A tensor's dtype and shape, as a digest starts: `float32[4, 8]`."""
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


class Recorder:
    """Records a running program's values (module docstring); `entries` are (label, fingerprint)."""

    def __init__(self) -> None:
        #: (stream, label, fingerprint): each stream (a forward, a backward, an optimizer, the end) is
        #: compared in its own order, the label says the value in words (display only)
        self.entries: list[tuple[str, str, str]] = []
        self._depth = 0
        self._forwards = 0
        self._backwards = 0
        self._steps = 0
        self._tops: list[torch.nn.Module] = []  # kept to the end (a child process): their end state is compared
        self._top_ids: set[int] = set()
        self._undo: list[Callable[[], None]] = []
        self._names: dict[int, str] = {}
        self._step_of: dict[int, int] = {}
        self._same_name: dict[str, int] = {}  # optimizers named alike so far
        self._param_names: dict[int, str] = {}  # id of a top-level module's parameter -> `critic.0.weight`
        self._module_names: dict[int, str] = {}  # id of a top-level module -> its name in the program
        self._owners: dict[int, str] = {}  # id of a parameter -> the name of the top-level module the program named
        self._passes: dict[str, int] = {}  # backward passes so far of each line that calls backward
        self.steps = 0  # training steps: the most steps of one optimizer, or backward passes without one

    def __enter__(self) -> Recorder:
        mod = torch.nn.modules.module
        handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post, always_call=True),
            register_optimizer_step_pre_hook(self._before_step),
            register_optimizer_step_post_hook(self._after_step),
        ]
        self._undo += [h.remove for h in handles]
        original = torch.autograd.backward

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            roots = [t for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)]
            # what this pass adds to each leaf's `.grad` (a hook sees it before it is accumulated): a
            # gradient left from an earlier pass that `zero_grad` clears before any step reads it is
            # not part of what the program computes
            added: list[tuple[str, str]] = []
            hooks = [leaf.register_hook(self._adder(leaf, added)) for leaf in _leaves(roots) if leaf.requires_grad]
            try:
                result = original(tensors, *args, **kwargs)
            finally:
                for h in hooks:
                    h.remove()
            self._backwards += 1
            stream = f"backward at `{_calling_line()}`"
            self._passes[stream] = self._passes.get(stream, 0) + 1
            label = f"{stream}: pass {self._passes[stream]}"
            for i, t in enumerate(roots):
                self._add(stream, f"{label}: root {i}", t)
            # graph order may differ between two programs computing the same thing: sort by value
            for value, name in sorted(added):
                self.entries.append((stream, f"{label}: gradient of {name}", value))
            return result

        torch.autograd.backward = backward  # type: ignore[assignment]
        self._undo.append(lambda: setattr(torch.autograd, "backward", original))
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        tops, self._tops = self._tops, []
        for i, module in enumerate(tops):
            for name, p in module.named_parameters():
                self._add("end", f"end: parameter {name} of top-level module {i} ({type(module).__name__})", p)
            for name, b in module.named_buffers():
                self._add("end", f"end: buffer {name} of top-level module {i} ({type(module).__name__})", b)
        self.steps = max(self._step_of.values(), default=self._backwards)

    def _add(self, stream: str, label: str, t: torch.Tensor) -> None:
        self.entries.append((stream, label, digest(t)))

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        self._depth += 1
        if self._depth == 1 and id(module) not in self._top_ids:
            self._top_ids.add(id(module))
            self._tops.append(module)
            named = variable_name(module)
            name = named or f"{type(module).__name__} #{sum(type(m) is type(module) for m in self._tops)}"
            self._module_names[id(module)] = f"{named} ({type(module).__name__})" if named else name
            for pname, p in module.named_parameters():
                self._param_names.setdefault(id(p), f"{name}.{pname}" if named else f"parameter {pname} of {name}")
                if named:
                    self._owners.setdefault(id(p), named)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self._forwards += 1
            name = self._module_names.get(id(module), type(module).__name__)
            stream = f"forward of {name}"
            self._passes[stream] = self._passes.get(stream, 0) + 1
            label = f"{stream}: call {self._passes[stream]}"
            for i, t in enumerate(x for x in tree_leaves(output) if isinstance(x, torch.Tensor)):
                self._add(stream, f"{label}: output {i}", t)
            for bname, b in module.named_buffers():
                self._add(stream, f"{label}: buffer {bname} after it", b)

    def _adder(self, leaf: torch.Tensor, added: list[tuple[str, str]]) -> Callable[[torch.Tensor], None]:
        name = self._param_name(leaf)  # not its value: a step the edit reorders changes it, not this gradient

        def seen(grad: torch.Tensor) -> None:
            added.append((digest(grad), name))

        return seen

    def _param_name(self, t: torch.Tensor) -> str:
        """A leaf as the program names it (`critic.0.weight`), else its dtype and shape."""
        return self._param_names.get(id(t)) or f"the leaf {_kind(t)}"

    def _params(self, opt: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
        return [
            (self._param_names.get(id(p)) or f"group {g} parameter {i}", p)
            for g, group in enumerate(opt.param_groups) for i, p in enumerate(group["params"])
        ]

    def _stream(self, opt: torch.optim.Optimizer) -> str:
        """The optimizer named so two runs agree (moving a step must not rename it): its type and
        its parameters' shapes, numbered among optimizers of the same name in the order they first step."""
        key = id(opt)
        if key not in self._names:
            params = self._params(opt)
            owners = {self._owners.get(id(p)) for _, p in params}
            if params and None not in owners:  # over modules the program named: named by them
                name = f"{type(opt).__name__} over {', '.join(sorted(o for o in owners if o))}"
            else:
                shapes = ",".join(str(list(p.shape)) for _, p in params)
                name = f"{type(opt).__name__} over {hashlib.blake2b(shapes.encode(), digest_size=4).hexdigest()}"
            self._same_name[name] = self._same_name.get(name, 0) + 1
            self._names[key] = f"optimizer {name} #{self._same_name[name]}"
            self._step_of[key] = 0
        return self._names[key]

    def _before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stream = self._stream(opt)
        for name, p in self._params(opt):
            if p.grad is not None:
                self._add(stream, f"{stream}: step {self._step_of[id(opt)] + 1}: gradient of {name}", p.grad)

    def _after_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stream = self._stream(opt)
        self._step_of[id(opt)] += 1
        label = f"{stream}: step {self._step_of[id(opt)]}"
        for name, p in self._params(opt):
            self._add(stream, f"{label}: {name} after it", p)
            for key, value in sorted(opt.state.get(p, {}).items(), key=lambda kv: str(kv[0])):
                if isinstance(value, torch.Tensor):
                    self._add(stream, f"{label}: optimizer state {key} of {name}", value)


def _calling_line() -> str:
    """The text of the program's line that called backward (`actor_loss.backward()`): the same in a
    run whose edits moved it."""
    frame = sys._getframe(2)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() or "?"


def _leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors autograd accumulates gradients into from `roots`' graphs."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    stack: list[Any] = [t.grad_fn for t in roots if t.grad_fn is not None]
    leaf_roots = [t for t in roots if t.grad_fn is None and t.requires_grad]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            out.append(variable)
        stack.extend(n for n, _ in node.next_functions)
    return leaf_roots + out


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    reference = "--reference" in args[: args.index("--")]
    out = args[args.index("--record") + 1]
    rest = args[args.index("--") + 1 :]
    head = args[: args.index("--")]
    pairs = [(a, head[i + 1]) for i, a in enumerate(head[:-1]) if a in ("--reach", "--allow")]
    groups = [_group(value) for a, value in pairs if a == "--reach"]
    confined = Confined([os.getcwd(), *(value for a, value in pairs if a == "--allow")])
    recorder, unseeded, reach = Recorder(), Unseeded(), Reach(groups)
    status = 0
    outcome: list[tuple[How, str]] = [(How.NOT_STARTED, "")]
    seed()
    confined.install()
    try:
        if reference:
            with unseeded, reach:
                status, outcome[0] = _run_reference(rest, recorder)
        else:
            from ..main import main as cli_main

            originals: dict[str, Callable[..., Any]] = {"run_path": runpy.run_path, "run_module": runpy.run_module}

            def watched(original: Callable[..., Any]) -> Callable[..., Any]:
                def run(*a: Any, **k: Any) -> Any:  # how the script (or module) ended, as `run` runs it
                    try:
                        result = original(*a, **k)
                    except SystemExit as e:
                        outcome[0] = _ended(e.code)
                        raise
                    except BaseException as e:
                        outcome[0] = (How.RAISED, type(e).__name__)
                        raise
                    outcome[0] = (How.RAN, "")
                    return result

                return run

            for name, original in originals.items():
                setattr(runpy, name, watched(original))
            try:
                with recorder, unseeded, reach:
                    status = cli_main(["run", *rest])
            finally:
                for name, original in originals.items():
                    setattr(runpy, name, original)
    finally:
        with open(out, "w", encoding="utf-8") as f:
            how, detail = outcome[0]
            json.dump({"how": str(how), "detail": detail, "steps": recorder.steps, "entries": recorder.entries,
                       "unseeded": unseeded.reads, "refused": confined.refused,
                       "unreached": [label for label in reach.labels if label not in reach.reached]}, f)
    return status


def _group(given: str) -> tuple[str, frozenset[int]]:
    """`FILE:L1,L2` (`--reach`): a file and lines of it, one of which the run should reach."""
    file, _, lines = given.rpartition(":")
    return file, frozenset(int(n) for n in lines.split(",") if n)


def _ended(code: object) -> tuple[How, str]:
    return (How.RAN, "") if code in (None, 0) else (How.EXITED, str(code if isinstance(code, int) else 1))


def _run_reference(rest: list[str], recorder: Recorder) -> tuple[int, tuple[How, str]]:
    """`SCRIPT [ARGS ...]` or `-m MODULE [ARGS ...]`, as python runs them, every saved tensor copied."""
    module = rest[0] == "-m"
    script, script_args = (rest[1], rest[2:]) if module else (rest[0], rest[1:])
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(script)))
    with torch.autograd.graph.saved_tensors_hooks(_copy, _same), recorder:
        try:
            if module:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            return code, _ended(e.code)
        except Exception as e:  # the program the user meant failed too: fix says so
            try:
                said = str(e)
            except Exception:  # noqa: BLE001 -- an exception whose __str__ raises: python's own words
                said = "<exception str() failed>"
            print(f"{type(e).__name__}: {said}", file=sys.stderr)
            return 1, (How.RAISED, type(e).__name__)
    return 0, (How.RAN, "")


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()  # parameters too: a step that overwrites one before backward is a write


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
