"""Worker for test_memory: ipd.memory against MemTracker, printed as one JSON line."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for conftest (pytest adds it in-process)

from test_memory import CASES, compare_with_memtracker  # noqa: E402

if __name__ == "__main__":
    print(json.dumps({f"{m}/{o}": compare_with_memtracker(m, o) for m, o in CASES}))
