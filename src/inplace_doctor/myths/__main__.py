"""`python -m inplace_doctor.myths [NAME]` is `inplace-doctor myths [NAME]`."""

import sys

from . import main

sys.exit(main())
