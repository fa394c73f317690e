"""The `inplace-doctor` command line.

Exit codes: 0 no finding of severity error/warning; 1 such findings; 2 usage
error (one line on stderr); 3 the user's model or factory itself raised.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import re
import sys
import traceback
from typing import Any, NoReturn, Sequence

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_MODEL_ERROR = 0, 1, 2, 3


class CliUsageError(Exception):
    """Raised for bad command-line input; becomes one line on stderr and exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CliUsageError(message)


_DTYPES = {
    "float32": "float32", "float": "float32", "f32": "float32",
    "float64": "float64", "double": "float64", "f64": "float64",
    "float16": "float16", "half": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}
_SHAPE = re.compile(r"^\d+(x\d+)*$")


def parse_input(spec: str) -> tuple[tuple[int, ...], str]:
    """`2x3x224x224` -> ((2, 3, 224, 224), "float32"); `2x16:int64` -> ((2, 16), "int64")."""
    shape_text, _, dtype_text = spec.strip().partition(":")
    shape_text = shape_text.replace("×", "x").replace(",", "x").lower()
    if not _SHAPE.match(shape_text):
        raise CliUsageError(
            f"cannot parse input shape {spec!r}: write dimensions joined by 'x', e.g. 2x3x224x224 "
            "or 2x16:int64"
        )
    dtype_text = (dtype_text or "float32").strip().lower().removeprefix("torch.")
    if dtype_text not in _DTYPES:
        close = difflib.get_close_matches(dtype_text, list(_DTYPES), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(sorted(set(_DTYPES.values())))}"
        raise CliUsageError(f"unknown dtype {dtype_text!r} in input {spec!r}; {hint}")
    return tuple(int(d) for d in shape_text.split("x")), _DTYPES[dtype_text]


def make_inputs(specs: Sequence[str], seed: int) -> tuple[Any, ...]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        shape, dtype_name = parse_input(spec)
        dtype = getattr(torch, dtype_name)
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=generator).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=generator).bool())
        else:
            out.append(torch.randint(0, 2, shape, generator=generator, dtype=dtype))
    return tuple(out)


def _closest_module(name: str) -> str | None:
    parent, _, leaf = name.rpartition(".")
    try:
        if parent:
            package = importlib.import_module(parent)
            candidates = [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))]
            close = difflib.get_close_matches(leaf, candidates, n=1)
            return f"{parent}.{close[0]}" if close else None
        close = difflib.get_close_matches(leaf, [m.name for m in pkgutil.iter_modules()], n=1)
        return close[0] if close else None
    except Exception:
        return None


def load_factory(spec: str) -> Any:
    """Import `PKG.MODULE:FACTORY` and return the factory callable."""
    module_name, colon, attr_path = spec.partition(":")
    if not colon or not module_name or not attr_path:
        raise CliUsageError(
            f"model spec {spec!r} needs the form PKG.MODULE:FACTORY, e.g. torchvision.models:resnet18 "
            "or inplace_doctor.examples:sigmoid_then_relu"
        )
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or module_name
        close = _closest_module(missing) if module_name.startswith(missing) else None
        if close:
            close = close + module_name[len(missing) :]
        hint = f"; did you mean {close!r}?" if close else ""
        raise CliUsageError(f"cannot import module {module_name!r} ({e}){hint}") from None
    except Exception as e:
        raise CliUsageError(f"importing {module_name!r} raised {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    obj: Any = module
    walked = module_name
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            matches = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {matches[0]!r}?" if matches else ""
            raise CliUsageError(f"{walked!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        walked += f".{part}" if walked != module_name else f":{part}"
    if not callable(obj):
        raise CliUsageError(f"{spec!r} is not callable (it is a {type(obj).__name__}); name a function or class that returns a model")
    return obj


def build_model(spec: str, input_specs: Sequence[str], seed: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Call the factory; return (model, args, kwargs)."""
    import torch

    factory = load_factory(spec)
    inputs = make_inputs(input_specs, seed)  # parse before running user code
    torch.manual_seed(seed)
    from ..trace.origins import ConstructionRecorder

    try:
        with ConstructionRecorder():  # where each inplace=True module is built: the line a flag fix edits
            made = factory()
    except Exception as e:
        raise _FactoryError(f"calling {spec} raised {type(e).__name__}: {e}") from e
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        model, example = made
        if isinstance(example, dict):
            kwargs = dict(example)
        elif isinstance(example, (tuple, list)):
            args = tuple(example)
        else:
            args = (example,)
    else:
        model = made
    if not isinstance(model, torch.nn.Module):
        raise CliUsageError(
            f"{spec} returned {type(model).__name__}; it must return an nn.Module or (model, example_inputs)"
        )
    if inputs:
        args, kwargs = inputs, {}
    if not args and not kwargs:
        raise CliUsageError(
            f"no inputs for {spec}: pass --input SHAPE (e.g. --input 2x3x224x224) or return "
            "(model, example_inputs) from the factory"
        )
    return model, args, kwargs


class _FactoryError(Exception):
    pass


def _parser() -> _Parser:
    parser = _Parser(prog="inplace-doctor", description="Find in-place operations that break PyTorch autograd.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    audit = sub.add_parser("audit", help="audit a model in one instrumented forward + backward")
    audit.add_argument("spec", metavar="PKG.MODULE:FACTORY", help="factory returning a model or (model, inputs)")
    audit.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                       help="an input tensor, e.g. 2x3x224x224 or 2x16:int64 (repeat for several)")
    audit.add_argument("--eval", action="store_true", help="audit in eval mode (default: train mode)")
    audit.add_argument("--no-backward", action="store_true", help="run forward only")
    audit.add_argument("--format", default="text", help="text, json or sarif")
    audit.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout")
    audit.add_argument("--select", action="append", default=[], metavar="CODES",
                       help="only these rule codes or prefixes (comma-separated)")
    audit.add_argument("--ignore", action="append", default=[], metavar="CODES",
                       help="skip these rule codes or prefixes (comma-separated)")
    audit.add_argument("--seed", type=int, default=0, help="seed for weights and random inputs (default 0)")
    audit.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    audit.add_argument("--fail-on", metavar="SEVERITY", help="error, warning (default), info or never: exit 1 at or above it")
    audit.add_argument("--config", metavar="FILE", help="first set the inplace flags from FILE (inplace.toml, as optimize writes it)")
    audit.add_argument("--stack", type=_stack_depth, default=2, metavar="N", help="frames shown per site in text: the line and the line in your code that called into it (default 2)")
    check = sub.add_parser("verify", help="check that the in-place configuration computes what its out-of-place form does")
    check.add_argument("spec", metavar="PKG.MODULE:FACTORY", help="factory returning a model or (model, inputs)")
    check.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                       help="an input tensor, e.g. 2x3x224x224 or 2x16:int64 (repeat for several)")
    check.add_argument("--eval", action="store_true", help="verify in eval mode (default: train mode)")
    check.add_argument("--steps", type=int, default=1, help="training steps per run (default 1)")
    check.add_argument("--sgd", type=float, metavar="LR", help="also take SGD steps with this learning rate and compare parameters")
    check.add_argument("--atol", type=float, default=1e-6)
    check.add_argument("--rtol", type=float, default=1e-5)
    check.add_argument("--seed", type=int, default=0, help="seed for weights and random inputs (default 0)")
    check.add_argument("--config", metavar="FILE", help="first set the inplace flags from FILE (inplace.toml, as optimize writes it)")
    for name, text in (
        ("memory", "measure where a training step's memory goes, and why autograd keeps it"),
        ("optimize", "decide every in-place flag from evidence, verify it, measure the memory it saves"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("spec", metavar="PKG.MODULE:FACTORY", help="factory returning a model or (model, inputs)")
        cmd.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                         help="an input tensor, e.g. 2x3x224x224 or 2x16:int64 (repeat for several)")
        cmd.add_argument("--eval", action="store_true", help="eval mode (default: train mode)")
        cmd.add_argument("--optimizer", default="sgd-momentum", help=f"one of {', '.join(_OPTIMIZERS)} (default sgd-momentum)")
        cmd.add_argument("--steps", type=int, default=2, help="training steps per measurement; the last is reported (default 2)")
        cmd.add_argument("--format", default="text", help="text or json")
        cmd.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
        cmd.add_argument("--png", metavar="FILE", help="also write the memory timeline as a PNG (needs matplotlib)")
        cmd.add_argument("--seed", type=int, default=0, help="seed for weights and random inputs (default 0)")
        if name == "optimize":
            cmd.add_argument("--write", metavar="FILE", help="write the config (TOML) to FILE, e.g. inplace.toml")
            cmd.add_argument("--enable-safe", action="store_true",
                             help="turn on every safe site, not only those that lower the peak")
            cmd.add_argument("--no-checkpoint", action="store_true", help="skip the activation-checkpointing measurement")
    runner = sub.add_parser(
        "run", help="run a training script (or -m module) as python would, under watch()",
        usage="inplace-doctor run [options] (SCRIPT.py | -m MODULE) [ARGS ...]",
        description="Run a training script (or -m module) as python would, under watch(). The script's output and "
                    "traceback are its own; the report goes to stderr (or --output FILE).",
    )
    runner.add_argument("--fail-fast", action="store_true", help="stop at the overwriting op itself")
    runner.add_argument(
        "--steps", type=int, metavar="N",
        help="watch only the first N training steps, then run at full speed. A step is an optimizer step (step() "
             "of any torch.optim optimizer); until the first one is seen, and in a script without one, a backward "
             "pass. When N backward passes come before any optimizer step, watching goes on until an optimizer "
             "step (then optimizer steps are counted) or the next backward pass (watching stops there). The last "
             "line says which was counted",
    )
    runner.add_argument("--select", action="append", default=[], metavar="CODES", help="only these rule codes or prefixes")
    runner.add_argument("--ignore", action="append", default=[], metavar="CODES", help="skip these rule codes or prefixes")
    runner.add_argument("--fail-on", metavar="SEVERITY", help="error, warning (default), info or never")
    runner.add_argument("--format", default="text", help="report format: text (default), json or sarif")
    runner.add_argument("--output", metavar="FILE",
                        help="write the report to FILE (default: stderr); the terminal then shows only the script's "
                             "own output")
    runner.add_argument("--stack", type=_stack_depth, default=2, metavar="N", help="frames shown per site in text: the line and the line in your code that called into it (default 2)")
    runner.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    runner.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS ...]")
    myths = sub.add_parser("myths", help="run the experiments that check the folklore about in-place ops")
    myths.add_argument("name", nargs="?", default="", help="only experiments whose name starts with this")
    rules = sub.add_parser("rules", help="list the rules")
    rules.set_defaults()
    rule = sub.add_parser("rule", help="print one rule's documentation")
    rule.add_argument("code")
    return parser


def _stack_depth(text: str) -> int:
    """`--stack N`: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stack needs a whole number of frames, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--stack needs at least 1 frame, got {value}")
    return value


def _audit(ns: argparse.Namespace) -> int:
    from .. import audit
    from ..render import get_renderer
    from ..rules import select_rules

    from .project import load_project_config, merged

    renderer = get_renderer(ns.format)
    config = merged(load_project_config(), _codes(ns.select), _codes(ns.ignore), ns.fail_on)
    select_rules(config.select, config.ignore)  # validate codes before running anything
    model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    _apply_config_option(model, ns.config)
    model.train(not ns.eval)
    report = audit(model, *args, backward=not ns.no_backward, select=config.select, ignore=config.ignore,
                   per_module_ignores=config.per_module_ignores, **kwargs)
    report.target = ns.spec
    report.stack = ns.stack
    if ns.output:
        try:
            with open(ns.output, "w", encoding="utf-8") as stream:
                renderer(report, stream)
        except OSError as e:
            raise CliUsageError(f"cannot write {ns.output!r}: {e.strerror}") from None
    else:
        renderer(report, sys.stdout)
    if ns.html:
        from ..render.html import write_html

        write_html(ns.html, f"inplace-doctor audit: {ns.spec}", report=report)
    threshold = config.fail_severity()
    return EXIT_FINDINGS if threshold is not None and report.failed(threshold) else EXIT_OK


def _apply_config_option(model: Any, path: str | None) -> None:
    """`--config FILE`: set the model's inplace flags from FILE, saying what changed (on stderr,
    so that JSON and SARIF on stdout stay clean)."""
    if path is None:
        return
    from ..engines.optimize.toml_config import apply_config

    changed = apply_config(model, path)
    flips = ", ".join(f"{name} -> {'on' if flag else 'off'}" for name, flag in sorted(changed.items()))
    print(f"inplace-doctor: applied {path}: " + (f"{len(changed)} flag(s) changed: {flips}" if changed else "no flag changed"),
          file=sys.stderr)


def _verify(ns: argparse.Namespace) -> int:
    import torch

    from .. import verify

    model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    _apply_config_option(model, ns.config)
    model.train(not ns.eval)
    optimizer = (lambda params: torch.optim.SGD(params, lr=ns.sgd)) if ns.sgd is not None else None
    result = verify(model, *args, steps=ns.steps, optimizer=optimizer, atol=ns.atol, rtol=ns.rtol, **kwargs)
    print(f"inplace-doctor verify of {ns.spec} ({'eval' if ns.eval else 'train'} mode)\n")
    print(result)
    return EXIT_OK if result else EXIT_FINDINGS


_OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "none")


def _optimizer(name: str) -> Any:
    import torch

    key = name.strip().lower()
    makers = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.01),
        "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
        "none": None,
    }
    if key not in makers:
        close = difflib.get_close_matches(key, list(makers), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(_OPTIMIZERS)}"
        raise CliUsageError(f"unknown optimizer {name!r}; {hint}")
    return makers[key]


def _progress() -> Any:
    """A live status line on a terminal (stderr); silent otherwise."""
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext(lambda stage: None)
    from rich.console import Console

    console = Console(stderr=True)

    @contextlib.contextmanager
    def status() -> Any:
        with console.status("starting") as live:
            yield lambda stage: live.update(stage)

    return status()


def _print_result(ns: argparse.Namespace, result: Any) -> None:
    """A memory report or a plan on stdout: its text, or its `to_dict()` as JSON."""
    if ns.format == "json":
        import json

        json.dump(result.to_dict(), sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        print(result, end="")


def _training_setup(ns: argparse.Namespace) -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
    """memory/optimize: check the format, then (optimizer factory, model in its mode, args, kwargs)."""
    if ns.format not in ("text", "json"):
        raise CliUsageError(f"unknown format {ns.format!r}; choose text or json")
    optimizer = _optimizer(ns.optimizer)
    model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    model.train(not ns.eval)
    return optimizer, model, args, kwargs


def _png(path: str | None, series: Any) -> None:
    from ..render.html import write_png

    if path and not write_png(path, series):
        print("note: --png needs matplotlib (pip install matplotlib); no PNG written", file=sys.stderr)


def _memory(ns: argparse.Namespace) -> int:
    from .. import memory
    from ..render.html import write_html

    optimizer, model, args, kwargs = _training_setup(ns)
    with _progress() as say:
        say(f"measuring {ns.steps} training step(s)")
        try:
            report = memory(model, *args, optimizer=optimizer, steps=ns.steps, **kwargs)
        except RuntimeError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(
                f"inplace-doctor: the training step of {ns.spec} raised, so its memory cannot be measured: {first}\n"
                f"run `inplace-doctor audit {ns.spec}` to name the op that overwrote and the one that saved, or "
                f"`inplace-doctor optimize {ns.spec}` for a configuration that runs",
                file=sys.stderr,
            )
            return EXIT_FINDINGS
    report.target = ns.spec
    _print_result(ns, report)
    if ns.html:
        write_html(ns.html, f"inplace-doctor memory: {ns.spec}", memory=[("as shipped", report)])
    _png(ns.png, [("as shipped", report)])
    return EXIT_OK


def _optimize(ns: argparse.Namespace) -> int:
    from .. import optimize
    from ..render.html import write_html

    optimizer, model, args, kwargs = _training_setup(ns)
    specs = list(ns.input) or None
    with _progress() as say:
        plan = optimize(model, *args, optimizer=optimizer, enable_safe=ns.enable_safe,
                        suggest_checkpoint=not ns.no_checkpoint, steps=ns.steps, input_specs=specs,
                        progress=say, **kwargs)
    plan.target = ns.spec
    _print_result(ns, plan)
    if ns.write:
        try:
            plan.write(ns.write)
        except OSError as e:
            raise CliUsageError(f"cannot write {ns.write!r}: {e.strerror}") from None
        if ns.format == "text":
            print(f"wrote {ns.write}")
    if ns.html:
        write_html(ns.html, f"inplace-doctor optimize: {ns.spec}", plan=plan)
    _png(ns.png, plan.memory_series())
    return EXIT_OK if bool(plan.verified) else EXIT_FINDINGS


def _run(ns: argparse.Namespace) -> int:
    import os

    from .project import load_project_config, merged
    from ..render import get_renderer
    from .script import run_script

    renderer = get_renderer(ns.format)
    if ns.module:
        target, args, module = ns.module, list(ns.target), True
    elif ns.target:
        target, args, module = ns.target[0], list(ns.target[1:]), False
        if not os.path.isfile(target):
            raise CliUsageError(f"no script {target!r}: give a path to a .py file, or -m MODULE")
    else:
        raise CliUsageError("run needs a script: inplace-doctor run train.py [ARGS ...] or -m MODULE [ARGS ...]")
    if ns.steps is not None and ns.steps < 1:
        raise CliUsageError(f"--steps must be at least 1, got {ns.steps}")
    config = merged(load_project_config(), _codes(ns.select), _codes(ns.ignore), ns.fail_on)
    from ..rules import select_rules

    select_rules(config.select, config.ignore)  # unknown codes fail before the script runs
    status, report, stats = run_script(
        target, args, module=module, fail_fast=ns.fail_fast, steps=ns.steps, select=config.select,
        ignore=config.ignore, per_module_ignores=config.per_module_ignores,
    )
    report.target = f"-m {target}" if module else target
    report.command = "run"
    report.stack = ns.stack
    summary = stats.summary(ns.steps)
    if ns.output:  # the report, and what was watched, to FILE; the terminal keeps the script's output only
        report.notes.append(summary)
        try:
            with open(ns.output, "w", encoding="utf-8") as stream:
                renderer(report, stream)
        except OSError as e:
            raise CliUsageError(f"cannot write {ns.output!r}: {e.strerror}") from None
    else:
        sys.stderr.flush()
        if stats.diagnosis:
            print(f"inplace-doctor: {stats.diagnosis}", file=sys.stderr)
        if report.findings or ns.format != "text":
            renderer(report, sys.stderr)
        print(f"inplace-doctor: {len(report.findings)} finding(s); {summary}", file=sys.stderr)
    if status:
        return int(status)
    threshold = config.fail_severity()
    return EXIT_FINDINGS if threshold is not None and report.failed(threshold) else EXIT_OK


_RUN_VALUE_OPTIONS = {"--steps", "--select", "--ignore", "--fail-on", "--format", "--output", "--stack"}


def _split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """`run [our options] (SCRIPT | -m MODULE) [script args]`: everything after the
    script (or module) belongs to it, unchanged, even what looks like our options."""
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if token.startswith("-m") and len(token) > 2:  # -mpackage.module
            return argv[:i] + ["-m", token[2:]], argv[i + 1 :]
        if token in _RUN_VALUE_OPTIONS:
            i += 2
            continue
        if token.startswith("-"):
            i += 1
            continue
        return argv[: i + 1], argv[i + 1 :]
    return argv, []


def _codes(values: list[str]) -> list[str] | None:
    out = [c for v in values for c in v.split(",") if c.strip()]
    return out or None


def _rules() -> int:
    from ..rules import RULES

    for code, r in sorted(RULES.items()):
        print(f"{code}  {r.severity.value:<8} {r.name:<36} {r.summary}")
    return EXIT_OK


def _rule(code: str) -> int:
    from ..rules import get_rule

    r = get_rule(code)
    print(f"{r.code} ({r.name}, {r.severity.value}): {r.title}\n\n{r.doc}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import ModelError, UsageError

    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        script_args: list[str] | None = None
        if argv[:1] == ["run"]:
            argv, script_args = _split_run(argv)
        ns = _parser().parse_args(argv)
        if script_args is not None:
            ns.target = ns.target + script_args
        if ns.command == "audit":
            return _audit(ns)
        if ns.command == "verify":
            return _verify(ns)
        if ns.command == "run":
            return _run(ns)
        if ns.command == "myths":
            from ..myths import main as myths_main

            return myths_main([ns.name] if ns.name else [])
        if ns.command == "memory":
            return _memory(ns)
        if ns.command == "optimize":
            return _optimize(ns)
        if ns.command == "rules":
            return _rules()
        return _rule(ns.code)
    except (CliUsageError, UsageError) as e:
        print(f"inplace-doctor: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (ModelError, _FactoryError) as e:
        cause = e.__cause__
        if cause is not None:
            traceback.print_exception(cause, file=sys.stderr)
        print(f"inplace-doctor: {e}", file=sys.stderr)
        return EXIT_MODEL_ERROR


def run() -> NoReturn:
    sys.exit(main())
