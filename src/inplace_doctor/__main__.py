"""`python -m inplace_doctor ...` is the `inplace-doctor` command."""

import sys

from .cli import main

sys.exit(main())
