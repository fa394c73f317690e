"""Exit codes of `inplace-doctor`, and the exceptions `main` turns into them.

Exit codes: 0 no finding of severity error/warning; 1 such findings; 2 usage
error (one line on stderr); 3 the user's model or factory itself raised.
"""

from __future__ import annotations

from ..errors import InplaceDoctorError, UsageError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_MODEL_ERROR = 0, 1, 2, 3


class CliUsageError(UsageError):
    """Raised for bad command-line input; becomes one line on stderr and exit 2."""


class FactoryError(InplaceDoctorError):
    """The user's model factory raised (chained as `__cause__`): its traceback, one line, exit 3."""
