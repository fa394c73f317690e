"""Find a line in a test file by its marker comment (`# <name>`), so assertions survive edits."""

from pathlib import Path


def marker_line(path: str, marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(Path(path).read_text().splitlines()) if text.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times in {path}"
    return hits[0]
