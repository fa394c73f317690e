"""The training step every engine runs, and the copies of the model and optimizer it runs on.

`copy_for_training` is the one copier: memory, verify and optimize never step the
user's own model or optimizer. `step_phases` is the one step driver (zero the
gradients, forward, loss via `loss_fn` or `default_loss`, backward, optimizer
step), a generator that stops at each `StepPhase` so that an engine can act between
them: memory switches its ledger's phase there; verify reads each stage of the
step there, with two runs advancing in turns.

The engines differ in two places, each a parameter: when gradients are zeroed
(`ZeroGrad`), and whether an output that needs no gradient is an error
(`require_grad`); and in how the optimizer is copied (`fresh_optimizer`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum
from typing import Any

import torch

from ..errors import UsageError
from ..trace.raised.blame import call_through, exception_text, raised_by_the_tool, recursion_headroom
from .preserve import tensors_in

LossFn = Callable[[Any], torch.Tensor]


class StepPhase(StrEnum):
    """Where a training step is; memory reports its peaks by the three middle ones."""

    SETUP = "setup"  # before the first step
    FORWARD = "forward"  # the forward and the loss are about to run
    BACKWARD = "backward"  # the loss exists; backward is about to run
    OPTIMIZER = "optimizer"  # backward is done; the optimizer is about to step
    DONE = "done"  # the step is over


class ZeroGrad(StrEnum):
    """When the driver sets the gradients to None."""

    # Before each step, through the optimizer (or the model without one): a step's gradients are
    # its own, whatever the copy carried (memory: what one step of a running loop holds).
    BEFORE_STEP = "before step"
    # After the optimizer's step, as a loop that calls `zero_grad()` after `step()`: without an
    # optimizer the gradients accumulate over the steps, on top of any the copy carried (verify).
    AFTER_OPTIMIZER = "after optimizer"


def default_loss(output: Any) -> torch.Tensor | None:
    """Sum of every floating-point output that requires grad (None when there is none)."""
    parts = [
        t.float().sum()
        for t in tensors_in(output)
        if t.is_floating_point() or t.is_complex()
        if t.requires_grad
    ]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total.real if total.is_complex() else total


def grad_mode_off() -> str | None:
    """Why no output can require grad whatever the model: the caller's grad mode is off (None when on)."""
    if torch.is_grad_enabled():
        return None
    block = "torch.inference_mode()" if torch.is_inference_mode_enabled() else "torch.no_grad()"
    return f"grad mode is off (called inside {block})"


def compute_loss(output: Any, loss_fn: LossFn | None) -> Any:
    """`loss_fn(output)`, or `default_loss(output)` without one."""
    return loss_fn(output) if loss_fn is not None else default_loss(output)


def copy_for_training(
    model: torch.nn.Module,
    optimizer: Any = None,
    *,
    flags: Mapping[str, bool] | None = None,
    fresh_optimizer: bool = False,
) -> tuple[torch.nn.Module, Any]:
    """A deep copy of `model`, an optimizer over the copy's parameters (None without one), and
    `flags` (module path -> `inplace`) set on the copy.

    `optimizer` is a `torch.optim.Optimizer` over `model`'s parameters or a callable
    `params -> optimizer` (called on the copy's). An instance is deep-copied together with the
    model, one memo for both, so its state and parameter groups come along over the copy's
    parameters (memory measures what a running optimizer holds); with `fresh_optimizer` a new
    one of its type is built from its `defaults` instead (verify's runs start from no state).
    """
    original = model
    with_optimizer = isinstance(optimizer, torch.optim.Optimizer) and not fresh_optimizer
    try:
        with recursion_headroom(copying=True):
            if with_optimizer:
                model, optimizer = call_through(copy.deepcopy, ((model, optimizer),), {})
            else:
                model = call_through(copy.deepcopy, (model,), {})
    except Exception as e:
        if raised_by_the_tool(e):
            raise
        raise _cannot_copy(original, optimizer if with_optimizer else None, e) from e
    if not with_optimizer:
        optimizer = _new_optimizer(optimizer, model.parameters())
    if flags:
        for name, m in model.named_modules():
            if name in flags:
                m.inplace = flags[name]
    return model, optimizer


def _cannot_copy(model: torch.nn.Module, optimizer: Any, error: Exception) -> UsageError:
    """Why the model (or the optimizer) cannot be deep-copied, naming the attribute that refuses."""
    culprit, where = type(model).__name__, _uncopyable_attribute(model)
    if where is None and optimizer is not None and _copies(model):
        culprit, where = f"the optimizer ({type(optimizer).__name__})", None
    found = f"; {where} is what refuses" if where else ""
    text = next(iter(exception_text(error).splitlines()), "")
    return UsageError(
        f"{culprit} cannot be copied: copy.deepcopy raised {type(error).__name__}" + (f" ({text})" if text else "")
        + f"{found}. verify, memory and optimize run on a deep copy of the model and its optimizer, so that "
        "yours are never stepped (audit needs no copy); keep such objects (locks, files, sockets, threads) "
        "outside the module, or give its class a __deepcopy__ that makes new ones for the copy"
    )


def _copies(obj: Any) -> bool:
    try:
        copy.deepcopy(obj)
    except Exception:
        return False
    return True


def _uncopyable_attribute(model: torch.nn.Module) -> str | None:
    """`path.attribute` (its type) of the first attribute of a submodule that deep-copy refuses."""
    internal = set(vars(torch.nn.Module()))
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute not in internal and not isinstance(value, torch.nn.Module) and not _copies(value):
                path = f"{name}.{attribute}" if name else f"{type(model).__name__}.{attribute}"
                kind = type(value).__qualname__
                kind = kind if type(value).__module__ == "builtins" else f"{type(value).__module__}.{kind}"
                return f"`{path}` (a {kind})"
    return None


def _new_optimizer(optimizer: Any, params: Any) -> Any:
    if optimizer is None:
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer)(params, **optimizer.defaults)
    if callable(optimizer):
        return call_through(optimizer, (params,), {})
    raise UsageError(
        f"optimizer must be a torch.optim.Optimizer or a callable taking parameters, got {type(optimizer).__name__}"
    )


# Set by the optimizer for its own bookkeeping, or how its kernels run: not what the update computes.
_NOT_SETTINGS = frozenset({"params", "foreach", "fused", "capturable", "differentiable", "initial_lr"})


def optimizer_settings(optimizer: Any) -> tuple[dict[str, Any], ...]:
    """Each parameter group's hyperparameters as plain values (`lr`, `momentum`, `nesterov`,
    `weight_decay`, `betas`, ...), for a report to say which update ran; a tensor `lr` as a number."""
    groups = getattr(optimizer, "param_groups", None) or ()
    out = []
    for group in groups:
        settings: dict[str, Any] = {}
        for key, value in group.items():
            if key in _NOT_SETTINGS or value is None:
                continue
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, (bool, int, float, str)) or (
                    isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value)):
                settings[str(key)] = list(value) if isinstance(value, tuple) else value
        out.append(settings)
    return tuple(out)


def step_phases(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: LossFn | None,
    optimizer: Any,
    *,
    zero_grad: ZeroGrad = ZeroGrad.BEFORE_STEP,
    require_grad: bool = True,
) -> Iterator[StepPhase]:
    """One training step, stopping before each of its phases: FORWARD (forward and loss),
    BACKWARD (only when backward runs), OPTIMIZER (only with an optimizer), then DONE.

    The output and the loss are released after backward, before the optimizer steps.
    `require_grad`: a loss that is None or needs no gradient raises UsageError; otherwise the
    step runs without backward.
    """
    if zero_grad is ZeroGrad.BEFORE_STEP:
        if optimizer is not None:
            call_through(optimizer.zero_grad, (), {"set_to_none": True})
        else:
            call_through(model.zero_grad, (), {"set_to_none": True})
    yield StepPhase.FORWARD
    with recursion_headroom():  # the engine's frames below the model's call
        output = call_through(model, args, kwargs)
    loss = call_through(compute_loss, (output, loss_fn), {})
    if require_grad:
        if loss is None or not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            off = grad_mode_off()
            if off is not None:
                raise UsageError(f"no output requires grad: {off}; call it outside that block")
            raise UsageError("no output requires grad: pass loss_fn, or a model with trainable parameters")
        backward = True
    else:
        backward = isinstance(loss, torch.Tensor) and loss.requires_grad
    if backward:
        yield StepPhase.BACKWARD
        call_through(loss.backward, (), {})
    del output, loss
    if optimizer is not None:
        yield StepPhase.OPTIMIZER
        call_through(optimizer.step, (), {})
        if zero_grad is ZeroGrad.AFTER_OPTIMIZER:
            call_through(optimizer.zero_grad, (), {"set_to_none": True})
    yield StepPhase.DONE


def training_step(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: LossFn | None,
    optimizer: Any,
    on_phase: Callable[[StepPhase], None] = lambda phase: None,
) -> None:
    """One step as memory measures and times it (`step_phases` with its defaults): zero grads
    (set to None), forward and loss, backward, release the output and loss, optimizer step;
    `on_phase` is called as each phase starts."""
    for phase in step_phases(model, args, kwargs, loss_fn, optimizer):
        on_phase(phase)
