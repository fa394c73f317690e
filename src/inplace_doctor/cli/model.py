"""The model a subcommand runs: `PKG.MODULE:FACTORY` imported and called, `--input SHAPE[:DTYPE]`
made into seeded tensors, `--config FILE` applied to it. Mistakes are `CliUsageError`s naming the
closest valid choice; a module that raises as it is imported, and a factory that raises or exits,
are `FactoryError`s (exit 3, with their traceback).

The factory runs as it would under `python -c "import m; m.build()"`: the current directory stays
importable while it runs (a factory may import lazily), and `sys.argv` holds only the module's file,
not the tool's arguments (a factory that parses it with argparse sees no options of the tool's).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import math
import pkgutil
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import CliUsageError, FactoryError, exited, first_line

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
    shape_text, colon, dtype_text = spec.strip().partition(":")
    shape_text = shape_text.replace("×", "x").replace(",", "x").lower()
    if colon and not dtype_text.strip():
        raise CliUsageError(
            f"input {spec!r} has nothing after ':': write SHAPE or SHAPE:DTYPE, e.g. 2x16 or 2x16:int64"
        )
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
    shape = tuple(int(d) for d in shape_text.split("x"))
    if 0 in shape:
        fixed = "x".join(str(max(d, 1)) for d in shape)
        raise CliUsageError(
            f"input {spec!r} has a dimension of 0: an empty tensor gives the model no values to compute on "
            f"(nor the checks that compare them); give at least 1 in every dimension, e.g. {fixed}"
        )
    return shape, _DTYPES[dtype_text]


def make_inputs(specs: Sequence[str], seed: int) -> tuple[Any, ...]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        shape, dtype_name = parse_input(spec)
        dtype = getattr(torch, dtype_name)
        try:
            if dtype.is_floating_point:
                out.append(torch.randn(shape, generator=generator).to(dtype))
            elif dtype == torch.bool:
                out.append(torch.randint(0, 2, shape, generator=generator).bool())
            else:
                out.append(torch.randint(0, 2, shape, generator=generator, dtype=dtype))
        except (RuntimeError, MemoryError, OverflowError, TypeError, ValueError):
            # too large to allocate, or a dimension beyond what torch can index: one line, not a traceback
            elements = math.prod(shape)
            size = elements * dtype.itemsize
            raise CliUsageError(
                f"cannot make input {spec!r}: {elements} {dtype_name} elements ({size} bytes) could not be "
                "allocated; give a smaller shape, e.g. 2x3x224x224"
            ) from None
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
    with cwd_importable():  # also while the hint looks for the closest name
        try:
            with _argv_of(module_name):
                module = importlib.import_module(module_name)
        except SystemExit as e:
            raise FactoryError(f"importing {module_name!r} ended in {exited(e)}: nothing was checked") from e
        except ModuleNotFoundError as e:
            missing = e.name or module_name
            if not (module_name == missing or module_name.startswith(f"{missing}.")):
                raise _import_raised(module_name, e) from e  # the module exists; an import in its code failed
            close = _closest_module(missing)
            if close:
                close = close + module_name[len(missing) :]
            hint = f"; did you mean {close!r}?" if close else (
                f"; no importable module has a name close to {missing!r}: check the spelling, and run "
                "from the folder that holds it (the current directory is searched) or install its package")
            raise CliUsageError(f"cannot import module {module_name!r} ({e}){hint}") from None
        except Exception as e:  # the module's own code raised (or does not compile): the user's traceback, exit 3
            raise _import_raised(module_name, e) from e
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


def _import_raised(module_name: str, e: BaseException) -> FactoryError:
    first = first_line(e)
    return FactoryError(f"importing {module_name!r} raised {type(e).__name__}" + (f": {first}" if first else ""))


@contextlib.contextmanager
def cwd_importable() -> Iterator[None]:
    """The current directory first on `sys.path` (as `python -c` has it), then taken off again."""
    if sys.path[:1] == [""]:
        yield
        return
    sys.path.insert(0, "")
    try:
        yield
    finally:
        if sys.path[:1] == [""]:
            del sys.path[0]
        elif "" in sys.path:  # the user's code put entries in front of it
            sys.path.remove("")


def _file_of(factory: Any) -> str:
    module_name = getattr(factory, "__module__", None) or ""
    return getattr(sys.modules.get(module_name), "__file__", None) or module_name or "-c"


@contextlib.contextmanager
def _argv_of(program: str) -> Iterator[None]:
    """`sys.argv` as the user's own program would have it: its name, no arguments (the tool's are
    not the program's)."""
    saved = sys.argv
    sys.argv = [program]
    try:
        yield
    finally:
        sys.argv = saved


def build_model(spec: str, input_specs: Sequence[str], seed: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Call the factory; return (model, args, kwargs)."""
    import torch

    factory = load_factory(spec)
    inputs = make_inputs(input_specs, seed)  # parse before running user code
    torch.manual_seed(seed)
    from ..trace.places.origins import ConstructionRecorder

    try:
        # ConstructionRecorder: where each inplace=True module is built, the line a flag fix edits
        with ConstructionRecorder(), cwd_importable(), _argv_of(_file_of(factory)):
            made = factory()
    except SystemExit as e:
        raise FactoryError(
            f"calling {spec} ended in {exited(e)}: a factory must return the model (or (model, inputs)), and "
            "nothing was checked; give its options defaults, or take them as parameters of the factory"
        ) from e
    except Exception as e:
        first = first_line(e)
        raise FactoryError(f"calling {spec} raised {type(e).__name__}" + (f": {first}" if first else "")) from e
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


def apply_config_option(model: Any, path: str | None) -> None:
    """`--config FILE`: set the model's inplace flags from FILE, saying what changed (on stderr,
    so that JSON and SARIF on stdout stay clean)."""
    if path is None:
        return
    from ..api import apply_config

    changed = apply_config(model, path)
    flips = ", ".join(f"{name} -> {'on' if flag else 'off'}" for name, flag in sorted(changed.items()))
    print(f"inplace-doctor: applied {path}: " + (f"{len(changed)} flag(s) changed: {flips}" if changed else "no flag changed"),
          file=sys.stderr)
