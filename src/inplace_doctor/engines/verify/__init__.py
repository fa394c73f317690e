"""verify: does an in-place configuration compute exactly what its out-of-place program does?

`result` holds what `inplace_doctor.verify()` returns (`VerifyResult`, `Difference`,
`InplaceSite`); `run` runs a program on its own copy with chosen in-place sites forced off
(`FunctionalInplace` switches functional `inplace=True` calls), a stage at a time; `compare`
compares two runs as they advance (tolerances `ATOL`, `RTOL`); `localize` finds the culprits;
`equivalence` puts them together. Exports `verify` (the public function),
`verify_configuration` (verify with module flags applied to each copy: optimize's proof),
`FunctionalInplace` and the records.
It may import the records, `trace/`, `rules/`, `engines/audit.py` and `training.py`/`preserve.py`; never memory/ or optimize/.
"""

from .compare import ATOL, RTOL
from .equivalence import verify, verify_configuration
from .result import Difference, InplaceSite, VerifyResult
from .run import FunctionalInplace

__all__ = [
    "ATOL", "RTOL", "Difference", "FunctionalInplace", "InplaceSite", "VerifyResult", "verify", "verify_configuration",
]
