"""The package's import graph has no cycle: every import of a protorl module by another, at module level or
inside a function, read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import protorl

PACKAGE = Path(protorl.__file__).parent


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(path): path for path in PACKAGE.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The protorl modules that `path` names in its imports (`from protorl.a import b` names protorl.a.b if that
    is a module, else protorl.a)."""
    names = set()
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names)
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module_of(path):
            found.add(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of modules (the first repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    graph = {name: imported_modules(path) for name, path in MODULES.items()}
    assert "protorl.config" in graph and graph["protorl.training"], "the import graph was not read"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


# The package's rooms from the ground up: a module imports only modules of its own room or of rooms below it
# (docs/layout.md draws them). The package's face (protorl/__init__.py) hands the API on lazily and is not a room.
FLOORS = (
    ("protorl.errors", "protorl.replay", "protorl.plots"),
    ("protorl.config", "protorl.envs"),
    ("protorl.agents", "protorl.logs", "protorl.gym", "protorl.runtime"),
    ("protorl.storage", "protorl.exploration"),
    ("protorl.training", "protorl.pretrained"),
    ("protorl.reports",),
    ("protorl.app", "protorl.conf"),
)


def floor_of(module: str) -> int:
    for floor, rooms in enumerate(FLOORS):
        if any(module == room or module.startswith(f"{room}.") for room in rooms):
            return floor
    raise AssertionError(f"{module} is in no room of FLOORS: add it to the floor it belongs on")


def test_the_floor_check_finds_an_import_from_below():
    assert floor_of("protorl.agents.proto.math") == 2 and floor_of("protorl.app.cli") == 6
    assert floor_of("protorl.envs.dmc") < floor_of("protorl.gym.export")


def test_no_module_imports_a_room_above_its_own():
    upward = []
    for name, path in MODULES.items():
        if name == "protorl":
            continue
        for target in imported_modules(path):
            if target != "protorl" and floor_of(target) > floor_of(name):
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that run back up: " + ", ".join(sorted(upward))
