"""Worker for test_memory: ipd.memory against MemTracker, printed as one JSON line."""

import json

from test_memory import CASES, compare_with_memtracker

if __name__ == "__main__":
    print(json.dumps({f"{m}/{o}": compare_with_memtracker(m, o) for m, o in CASES}))
