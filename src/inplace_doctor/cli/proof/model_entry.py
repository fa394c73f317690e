"""A model factory run as a program, so `fix` can check its fixes as it checks a script's.

`python -m inplace_doctor.cli.proof.model_entry PKG.MODULE:FACTORY [--input SHAPE[:DTYPE] ...] [--eval]
[--seed N]` builds the model as `audit` does (`model.py`: the factory called with the seed set,
the inputs seeded tensors), runs one forward and the backward of the sum of its floating outputs
(`audit`'s default loss), and ends. `inplace-doctor fix PKG.MODULE:FACTORY --input ...` runs this
module under `inplace-doctor run -m`: the reference run and each check run it too, in the copy of
the project, so the factory's module is imported from the copy with the edits made there, and the
recorder compares the forward outputs, the gradients and the parameters at the end. A factory
that raises (or whose module does) ends it as it ends `audit`: its traceback, one line, exit 3.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    from ...engines.training import default_loss
    from ..args import add_model, add_seed
    from ..errors import EXIT_USAGE, CliUsageError, FactoryError, report_user_error
    from ..model import build_model

    parser = argparse.ArgumentParser(prog="inplace-doctor fix", description="a model factory, run once forward and backward")
    add_model(parser)
    add_seed(parser)
    ns = parser.parse_args(list(argv))
    try:
        model, args, kwargs = build_model(ns.spec, ns.input, ns.seed)
    except CliUsageError as e:
        print(f"inplace-doctor: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FactoryError as e:  # as `audit` says it: the factory's traceback, then one line; exit 3
        return report_user_error(e)
    model.train(not ns.eval)
    output = model(*args, **kwargs)
    loss = default_loss(output)
    if loss is not None:
        loss.backward()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
