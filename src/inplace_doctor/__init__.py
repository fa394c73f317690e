# isort: skip_file
"""inplace-doctor: find the in-place operations that break autograd, and name both culprits.

    import inplace_doctor as ipd
    report = ipd.audit(model, x)          # one instrumented forward + backward
    with ipd.watch() as session:          # or any training code
        train_step()
    mem = ipd.memory(model, x, optimizer=opt)  # where a training step's memory goes
"""

from __future__ import annotations

import warnings

# Without numpy, torch warns "Failed to initialize NumPy" when it is first imported; the tool
# needs no numpy, and the first thing `inplace-doctor audit ...` prints should be the report.
# Exactly that warning, and only if this import is torch's first.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch  # noqa: F401

from . import _compat  # noqa: F401,E402  (fails early, naming the torch version)
from . import render  # noqa: F401,E402  (registers how every result prints: str(), _repr_html_)
from ._version import __version__  # noqa: E402
from .api import *  # noqa: F401,F403,E402
from .api import __all__  # noqa: E402
