"""No module of llmgw imports one that imports it back, even from inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import llmgw

SRC = Path(llmgw.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every llmgw name path imports, at the top or deferred into a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    modules = {
        _module_name(path): path for path in SRC.rglob("*.py") if "proto" not in path.relative_to(SRC).parts
    }
    return {
        name: {other for other in _imports(path) if other in modules and other != name}
        for name, path in modules.items()
    }


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from start back to start, if there is one."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        name, path = stack.pop()
        for other in sorted(graph[name]):
            if other == start:
                return [*path, start]
            if other not in seen:
                seen.add(other)
                stack.append((other, [*path, other]))
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    """A deferred import that hides a circle (render and sessions had one) is a circle all the same."""
    graph = _graph()
    cycles = [cycle for name in sorted(graph) if (cycle := _cycle_through(graph, name))]
    assert not cycles, "modules that import each other:\n" + "\n".join(" -> ".join(c) for c in cycles)
