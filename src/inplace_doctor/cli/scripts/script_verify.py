"""`inplace-doctor run --verify`: verify each model a script runs against its out-of-place form.

While the script is watched, the first call of each top-level module (a module
called from outside any module's forward: the model, a discriminator, a loss
module) is recorded: the module itself, a detached copy of its arguments (as
`verify` clones them) and each of its submodules' train/eval flags (put back
exactly as the script left them once verified). After the script has ended,
`verify()` runs each recorded module on those arguments, in those modes, as
configured and with every module `inplace` flag and functional `inplace=True`
call forced off, each on a deep copy, and compares outputs, loss (the sum of
the floating outputs), gradients, buffers and inputs. The weights verified are
the ones the module holds when the script ends; equivalence is a property of the
program, which the weights do not change (a NaN in trained weights is reported
as such, by position).

Nothing runs inside the script's own time: recording copies a batch per model,
and the verification runs after the script (and the watch) ended, so what the
script computed is unchanged. `inplace-doctor fix` uses this to prove that a
flag it flipped left a program that computes what its out-of-place form does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...verification import ModelVerified, VerifyOutcome

#: the first distinct top-level modules verified; later ones are counted in a note
LIMIT = 8


@dataclass
class ModelCall:
    """A top-level module's first call: the module, a detached copy of its arguments, its mode."""

    label: str
    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: each submodule's train/eval flag at the call (a frozen BatchNorm in a training model stays eval)
    modes: list[tuple[torch.nn.Module, bool]]

    @property
    def training(self) -> bool:
        return self.modes[0][1]


class ModelCalls:
    """Records the first call of each top-level module while a watch session's tracer runs."""

    def __init__(self) -> None:
        self.calls: list[ModelCall] = []
        self.skipped = 0  # distinct top-level modules past LIMIT
        self._seen: set[int] = set()

    def observe(self, modules: Any) -> None:
        """Chain onto `modules.on_top_level` (the tracer's ModulePaths), keeping what it did."""
        inner: Callable[[torch.nn.Module, Any, Any], None] | None = modules.on_top_level

        def on_top_level(module: torch.nn.Module, args: Any, kwargs: dict[str, Any] | None) -> None:
            if inner is not None:
                inner(module, args, kwargs)
            if args is not None:
                self._record(module, args, kwargs or {})

        modules.on_top_level = on_top_level

    def _record(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        from ...engines.verify.run import clone_inputs
        from ...trace.process.compiled import uncompiled

        if id(module) in self._seen:
            return
        self._seen.add(id(module))
        if len(self.calls) >= LIMIT:
            self.skipped += 1
            return
        # verified as the module a wrapper runs: compiled code as its eager meaning, DDP's
        # module without the gradient synchronisation a single process cannot do
        module = uncompiled(module)
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module = module.module
        with torch.no_grad():
            copied_args, copied_kwargs = clone_inputs((tuple(args), kwargs))
        label = _label(module, {c.label for c in self.calls})
        self.calls.append(ModelCall(label, module, copied_args, copied_kwargs, _modes(module)))

    def verify_all(self, rank: int | None = None) -> list[ModelVerified]:
        """One record per recorded module: equivalent, or how it differs (or why it could not be run).
        In a process group (`rank`) nothing is run: a sharded module's copy would call collectives
        the other ranks do not join. `render.verify_text.model_note` says each in words."""
        from ...engines.verify import verify

        if rank is not None and self.calls:
            self.calls = []
            return [ModelVerified("", VerifyOutcome.NOT_VERIFIED, reason=(
                f"not run: the script trained in a process group (rank {rank}), where a copy of a sharded or synchronised "
                "model calls collectives the other ranks do not join; verify the model in one process "
                "(inplace-doctor verify MODULE:FACTORY)"))]
        verified = []
        for call in self.calls:
            now = _modes(call.module)  # the flags the script left, put back exactly after
            try:
                _set_modes(call.modes)
                result = verify(call.module, *call.args, **call.kwargs)
            except Exception as e:  # a model verify cannot copy or run (DDP, a non-differentiable output)
                first = str(e).splitlines()[0] if str(e) else ""
                verified.append(ModelVerified(call.label, VerifyOutcome.NOT_VERIFIED, call.training,
                                              reason=f"{type(e).__name__}: {first}"))
                continue
            finally:
                _set_modes(now)
            verified.append(ModelVerified.of(call.label, call.training, result))
        if self.skipped:
            verified.append(ModelVerified("", VerifyOutcome.NOT_VERIFIED, reason=(
                f"{self.skipped} more top-level module(s) ran and were not verified (the first {LIMIT} are)")))
        self.calls = []  # nothing the script made is kept alive after the report
        return verified


def _modes(module: torch.nn.Module) -> list[tuple[torch.nn.Module, bool]]:
    return [(m, m.training) for m in module.modules()]


def _set_modes(modes: list[tuple[torch.nn.Module, bool]]) -> None:
    for m, flag in modes:
        if m.training is not flag:
            m.training = flag


def _label(module: torch.nn.Module, taken: set[str]) -> str:
    from ...trace.places.modules import unique_label

    return unique_label(type(module).__name__, taken)
