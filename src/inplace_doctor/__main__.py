"""`python -m inplace_doctor ...` is the `inplace-doctor` command."""

import sys

from .cli.main import main

sys.exit(main())
