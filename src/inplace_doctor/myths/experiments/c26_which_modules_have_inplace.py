# mypy: ignore-errors
"""Which torch.nn modules have an `inplace` option."""

import inspect

from torch import nn

CLAIM = "Dropout cannot be in-place; BatchNorm(affine=False) and GELU are candidates for inplace=True"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    has = sorted(
        name for name, cls in vars(nn).items()
        if inspect.isclass(cls) and issubclass(cls, nn.Module) and "inplace" in inspect.signature(cls.__init__).parameters
    )
    dropout, gelu, bn = "Dropout" in has, "GELU" in has, "BatchNorm2d" in has
    return (f"Dropout has it: {dropout}; GELU: {gelu}; BatchNorm2d: {bn}; {len(has)} modules have one",
            "FALSE" if dropout and not gelu and not bn else "TRUE")
