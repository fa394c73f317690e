"""The rule reference (docs/rules/), generated from the rule docstrings (run from a checkout).

    python tools/rule_reference.py            # write docs/rules/
    python tools/rule_reference.py --check    # exit 1 if docs/rules/ is out of date

One page per code (its severity, what it means, why it matters, a minimal
flagged example and its fix, all from the docstring) and an index. The test
suite runs the check, so the pages cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inplace_doctor.render.sarif import doc_to_markdown
from inplace_doctor.rules import RULES, Rule

DOCS_RULES = Path(__file__).resolve().parents[1] / "docs" / "rules"


def page(rule: Rule) -> str:
    body = doc_to_markdown("\n".join(rule.doc.splitlines()[1:]).strip())
    return (
        f"# {rule.code}: {rule.title}\n\n"
        f"`{rule.name}` · severity **{rule.severity.value}** · "
        f"`inplace-doctor rule {rule.code}` prints this page\n\n"
        f"{rule.summary}\n\n{body}\n"
        f"Suppress on one line with `# inplace-doctor: ignore[{rule.code}]`, for a region with "
        f"`ipd.suppress(\"{rule.code}\")`, or project-wide with `ignore = [\"{rule.code}\"]` in "
        "`[tool.inplace-doctor]`.\n"
    )


def index() -> str:
    lines = [
        "# Rule reference",
        "",
        "Generated from the rule docstrings by `python tools/rule_reference.py`; "
        "a test keeps it in sync. Every example runs as it stands after `import torch, torchvision`, "
        "`from torch import nn` and `from torch.utils.checkpoint import checkpoint`; the test suite runs "
        "each one under `ipd.watch()` and checks that its rule reports it.",
        "",
        "Predictions (IPD101, IPD104, IPD109, IPD110) have one severity policy. The severity in the table "
        "is that of a finding backward confirmed. A prediction backward never settled is reported "
        "unconfirmed, with the reason: as a `warning` when backward (or forward) would have reached it but "
        "stopped at an earlier error first (an in-place one, or any error raised inside backward), under "
        "`audit`, `watch` and `run` alike, or no backward was run (`audit --no-backward`); as `info` when "
        "no backward ran through its graph while the session was active. One whose graph is freed without "
        "backward reaching it is not reported (the report's statistics count it).",
        "",
        "| code | name | severity | what it reports |",
        "|---|---|---|---|",
    ]
    for code, r in sorted(RULES.items()):
        lines.append(f"| [{code}]({code}.md) | `{r.name}` | {r.severity.value} | {r.summary} |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """File name -> content of every page of the reference."""
    out = {"README.md": index()}
    out.update({f"{code}.md": page(r) for code, r in sorted(RULES.items())})
    return out


def stale(folder: Path) -> list[str]:
    """Files of `folder` that differ from what the rules generate (or are missing or extra)."""
    expected = pages()
    bad = [name for name, text in expected.items() if not (folder / name).is_file() or (folder / name).read_text() != text]
    if folder.is_dir():
        bad += sorted(p.name for p in folder.glob("*.md") if p.name not in expected)
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/rule_reference.py", description="write or check docs/rules/")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out", default=str(DOCS_RULES))
    ns = parser.parse_args(argv)
    folder = Path(ns.out)
    if ns.check:
        bad = stale(folder)
        if bad:
            print(f"docs/rules is out of date ({', '.join(bad)}): run python tools/rule_reference.py", file=sys.stderr)
            return 1
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (folder / name).write_text(text)
    for extra in stale(folder):
        (folder / extra).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
