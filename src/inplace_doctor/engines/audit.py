"""`audit()`: a model (or any callable) run once under the tracer, with its state restored."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..causes import Unreached
from ..errors import InplaceError, UnsupportedModuleError, UsageError, raise_tool_error, tool_error_of
from ..findings import Severity
from ..report import Report
from ..rules import select_rules
from ..rules.dispatch import Analyzer
from ..sites import ROOT_LABEL
from ..trace.places.modules import refuse_opaque
from ..trace.raised.blame import forget_frames, passed_through
from ..trace.tracer import Tracer
from . import callables, replay_writes, tracer_mode
from .finish import classify_or_raise, finish_report, sorted_findings
from .preserve import Preserved, generators_in, labelled_tensors, private_inputs, refuse_lazy, refuse_meta, tensors_in
from .training import default_loss, grad_mode_off

Selection = Iterable[str] | str | None


def audit(
    model: torch.nn.Module | Callable[..., Any],
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    backward: bool = True,
    select: Selection = None,
    ignore: Selection = None,
    per_module_ignores: dict[str, list[str]] | None = None,
    names: Mapping[str, torch.nn.Module] | None = None,
    check_contents: bool = False,
    deep: bool | None = None,
    **kwargs: Any,
) -> Report:
    """Run `model(*args, **kwargs)` (and backward) once under the tracer; return a Report.

    The model's state is left exactly as found: parameters, buffers (running stats,
    `num_batches_tracked`), `.grad` (None stays None), `requires_grad` of parameters
    and leaf inputs, train/eval flags, the global RNG state, the `torch.Generator`s the
    model's modules or the inputs hold, plain module attributes that hold tensors, and the
    caller's inputs (inside lists, tuples, dicts and dataclasses).
    Not its structure: submodules, hooks or attributes holding no tensor that forward adds stay.
    For a callable that is no module, what is restored and named are the modules it holds where
    they are found without running it (`engines/callables.py`): the module a method belongs to,
    its closure's, the module-level names its code reads, its object's attributes; others not.

    Args:
        model: an `nn.Module`; a `torch.compile`d one runs eagerly for the audit (not TorchScript).
            Or any callable (a rollout function, a policy object, `model.rollout`): a write into
            its arguments anywhere in its code is IPD106.
        *args, **kwargs: the model's inputs.
        loss_fn: maps the output to a scalar for backward; default: the sum of
            every floating output that requires grad.
        backward: also run backward, which confirms the findings it reaches.
        select, ignore: rule codes or prefixes (`"IPD101"`, `"IPD1"`).
        per_module_ignores: module-path glob -> codes to drop there
            (`{"model.backbone.*": ["IPD105"]}`); see also `ipd.suppress`.
        names: label -> module, to name the model (`{"policy": model}`) or
            models inside it (`{"G": gan.generator, "D": gan.discriminator}`)
            in findings: `D.2.weight` instead of `model.discriminator.2.weight`.
        check_contents: fingerprint every saved tensor and compare it at unpack
            (IPD109 for writes no op makes: extension kernels, NumPy, pointers).
            When IPD109 finds a change without its writing line, the model runs
            a second time, all of the above restored, to name the line.
        deep: as `watch`'s: by default the fast tracer runs when the selected
            rules allow it, else the deep one, with a note in the report.

    Example:
        >>> import inplace_doctor as ipd
        >>> from inplace_doctor.examples import SigmoidThenReLU
        >>> model, x = SigmoidThenReLU(), torch.randn(4, 8)
        >>> ipd.audit(model, x).codes
        ['IPD101']
    """
    run = model  # what is called: the model, or a callable that is no module (`engines/callables.py`)
    model, names = _module_of(model, names)
    try:
        refuse_opaque(model, "the model")
    except UnsupportedModuleError as e:
        raise UsageError(str(e)) from None
    named = list(model.named_modules())  # one walk of the tree, shared below
    modules = [m for _, m in named]
    refuse_lazy(model, modules)
    refuse_meta(model, tensors_in((args, kwargs)), "audit", modules)
    root_label, prefix = ROOT_LABEL, ""
    if names:
        labels = {id(m): label for label, m in names.items() if isinstance(m, torch.nn.Module)}
        root_label, prefix = "", labels.get(id(model), "model")
    rules = select_rules(select, ignore)
    analyzer = Analyzer(rules, root_label=root_label, per_module_ignores=per_module_ignores)
    args, kwargs = private_inputs(args), private_inputs(kwargs)
    inputs = tensors_in((args, kwargs))
    preserved = Preserved(model, inputs, modules, generators_in((args, kwargs)))
    wanted = tracer_mode.asked(deep)
    deep_because = tracer_mode.choose(rules, wanted)
    tracer = Tracer(
        analyzer, before_write=preserved.before_write, track_call_inputs=False, check_contents=check_contents,
        fast=not wanted and not deep_because,
    )
    for label, sub in (names or {}).items():
        if sub is not model:
            tracer.modules.add_root(sub, label)
    tracer.modules.add_root(model, prefix, named=None if names else named)
    tracer.set_caller_inputs(labelled_tensors(args, kwargs), anywhere=run is not model)
    report = Report(
        findings=analyzer.findings,
        target=type(model).__name__ if run is model else callables.name_of(run),
        mode="train" if model.training else "eval",
        command="audit",
        root_label=root_label,
    )
    if deep_because:
        report.notes.append(tracer_mode.switched_note(deep_because, tracer_mode.how_asked(deep, "audit(deep=False)")))
    with preserved, tracer:
        try:
            output = run(*args, **kwargs)
        except InplaceError:
            raise
        except Exception as exc:
            raise_tool_error(exc)  # a backward inside forward reached an overwritten saved tensor
            passed_through(exc)
            classify_or_raise(exc, tracer, analyzer, report, "forward", report.target)
            analyzer.finish(Unreached.FORWARD_STOPPED, Severity.WARNING)
            return finish_report(report, tracer, analyzer)
        tracer.flush()
        if run is not model:  # the function's own code ended: writes outside a module are its caller's now
            tracer.set_caller_inputs(labelled_tensors(args, kwargs))
        if backward:
            _backward(output, loss_fn, tracer, analyzer, report)
        # Before the graph is freed: what is still pending was never reached by a backward.
        tracer.check_contents_now()
        analyzer.finish(Unreached.NO_BACKWARD, Severity.WARNING)
        del output
    report = finish_report(report, tracer, analyzer)
    if tracer.contents.unlocated:  # IPD109 without the writing line: the run repeats, so look for it
        replay_writes.name_write_lines(report, tracer.contents.unlocated, run, args, kwargs, inputs, modules, loss_fn, backward)
        report.findings = sorted_findings(report.findings)
    return report


def _module_of(
    model: torch.nn.Module | Callable[..., Any], names: Mapping[str, torch.nn.Module] | None
) -> tuple[torch.nn.Module, Mapping[str, torch.nn.Module] | None]:
    """The module audit restores and names, with the names: `model` itself; for a callable that is
    no module, the module its method belongs to, else the modules it holds, named as it holds them
    (`engines/callables.py`; the caller's `names` win)."""
    if isinstance(model, torch.nn.Module):
        return model, names
    if not callable(model):
        raise UsageError(f"audit() needs a torch.nn.Module or a callable, got {type(model).__name__}")
    owner, found = callables.module_of_method(model), callables.modules_of(model)
    names = {**({} if owner is not None else dict(found)), **(names or {})}
    return (owner if owner is not None else torch.nn.ModuleList([m for _, m in found])), names


def _backward(output: Any, loss_fn: Callable[[Any], torch.Tensor] | None, tracer: Tracer, analyzer: Analyzer,
              report: Report) -> None:
    """Backward of the loss (`loss_fn(output)`, else the default loss), skipped with a note where no
    output requires grad; an error it raises stops backward: the tool's diagnosis (PyTorch's error
    at an overwritten saved tensor) is noted, any other error classified or re-raised."""
    loss = loss_fn(output) if loss_fn is not None else default_loss(output)
    if loss is None or not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        off = grad_mode_off()
        report.notes.append("backward skipped: no output requires grad" + (f": {off}" if off else ""))
        return
    report.backward = True
    try:
        loss.backward()
    except Exception as exc:
        if tool_error_of(exc) is not None:  # PyTorch's error, which the tool's diagnosis rides on
            tracer.left(exc)
            forget_frames(exc)
            report.notes.append("backward raised at the first overwritten saved tensor it reached")
        else:
            passed_through(exc)
            classify_or_raise(exc, tracer, analyzer, report, "backward", report.target)
        analyzer.backward_stopped()
    else:
        analyzer.backward_completed()
