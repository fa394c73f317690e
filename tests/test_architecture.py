"""The package's layout is its architecture: rooms, one-way imports, small modules.

Reads the source with `ast` (imports nothing of the package): every import, lazy ones inside
functions and `TYPE_CHECKING` blocks included, must point to the same room or a room below,
and no set of modules may import each other in a circle. docs/architecture.md lists the rooms;
the folders must match it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "inplace_doctor"
MAX_LINES = 400

# Rooms from the bottom up; a module may import its own room and the rooms below it.
ROOMS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("_compat", "_parsing", "_version", "errors", "printing")),
    ("records", ("causes", "sites", "events", "findings", "explanations", "verification", "report")),
    ("trace", ("trace",)),
    ("rules", ("rules",)),
    ("engines", ("engines",)),
    ("api", ("api", "testing")),
    ("render", ("render",)),
    ("myths", ("myths",)),
    ("cli", ("cli", "__main__")),
    ("integrations", ("integrations",)),  # framework callbacks: on top, through api; nothing imports them
    ("face", ("__init__",)),  # the package's own __init__: imports the rooms, imported by none
]
# Programs the package ships as data, run by path (the bundled example model and training
# script, the myth experiments): they import the package like any user code does.
DATA = ("examples", "myths.experiments")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room_of(module: str) -> int | None:
    if any(module == d or module.startswith(d + ".") for d in DATA):
        return None
    for rank, (_, prefixes) in enumerate(ROOMS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no room: add it to ROOMS here and to docs/architecture.md")


def _add_module(found: set[str], dotted: str) -> None:
    """Add to `found` the package's module `dotted` names (relative to the package; "" is its
    `__init__`), nothing where it names none (a name a module defines)."""
    if dotted == "":
        found.add("__init__")
    elif dotted in MODULES:
        found.add(dotted)


def imports_of(module: str) -> set[str]:
    """The package's modules that `module` imports (submodules named in `from x import y` too)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    here = module.split(".") if is_package(path) and module != "__init__" else module.split(".")[:-1]
    if module == "__init__":
        here = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "inplace_doctor" or node.module.startswith("inplace_doctor.")):
                target = node.module.removeprefix("inplace_doctor").removeprefix(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                if sub in MODULES:
                    _add_module(found, sub)
                else:
                    _add_module(found, target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "inplace_doctor" or alias.name.startswith("inplace_doctor."):
                    _add_module(found, alias.name.removeprefix("inplace_doctor").removeprefix("."))
    found.discard(module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES if room_of(m) is not None}


def test_every_import_points_to_the_same_room_or_below() -> None:
    upward = []
    for module, targets in GRAPH.items():
        for target in targets:
            rank = room_of(target)
            if rank is not None and rank > room_of(module):  # type: ignore[operator]
                upward.append(f"{module} ({ROOMS[room_of(module)][0]}) imports {target} ({ROOMS[rank][0]})")  # type: ignore[index]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    assert _cycles(GRAPH) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_400_lines(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {lines} lines: split it by idea"


def test_every_room_folder_says_what_lives_there_and_what_it_may_import() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE or any(module_name(init).startswith(d) for d in DATA):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 15 and "import" in doc, f"{init.relative_to(ROOT)}: a docstring naming what lives here and what it may import"


def test_the_folders_match_docs_architecture() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_/]+/)` \|", doc, re.MULTILINE))
    folders = {
        str(p.parent.relative_to(PACKAGE)) + "/"
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and "__pycache__" not in p.parts
    }
    assert documented == folders


MAX_MODULES = 16


def test_no_room_holds_more_than_16_modules() -> None:
    """A room a reader can walk (issue 39): a folder past 16 modules is split into sub-rooms with names."""
    crowded = {}
    for init in PACKAGE.rglob("__init__.py"):
        if "__pycache__" in init.parts or init.parent == PACKAGE:  # the root: base, records and the face (ROOMS)
            continue
        modules = [p for p in init.parent.iterdir() if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()]
        if len(modules) > MAX_MODULES:
            crowded[str(init.parent.relative_to(PACKAGE)) or "."] = len(modules)
    assert not crowded, f"folders over {MAX_MODULES} modules (sub-packages count as one): {crowded}"
