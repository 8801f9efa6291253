"""The gateway stands on its own: nothing it imports, however indirectly, is the control plane."""

from __future__ import annotations

import ast
from pathlib import Path

import llmgw

SRC = Path(llmgw.__file__).parent.parent


def _path(module: str) -> Path | None:
    """The file module is read from, when it is llmgw's own."""
    base = SRC.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str) -> set[str]:
    """Every llmgw module importing module runs: what it names, and the packages above each of them.

    Imports inside functions and under TYPE_CHECKING count too: a dependency the gateway takes
    late, or for its types only, is still one on the control plane.
    """
    path = _path(module)
    assert path is not None, module
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            named.add(node.module)
            # `from llmgw.store import catalog` imports a module, `from llmgw.store import Store` a name.
            named.update(f"{node.module}.{a.name}" for a in node.names if _path(f"{node.module}.{a.name}"))
    found = set()
    for name in named:
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if name.startswith("llmgw.") and _path(name) is not None}


def imported_by(roots: list[str]) -> dict[str, str]:
    """Every llmgw module the roots import, directly or not, with one module that imports it."""
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        for dependency in _imports(module):
            if dependency not in seen and dependency not in roots:
                seen[dependency] = module
                todo.append(dependency)
    return seen


def gateway_modules() -> list[str]:
    return sorted(f"llmgw.gateway.{p.stem}" for p in (SRC / "llmgw" / "gateway").glob("*.py"))


def test_no_gateway_module_imports_the_control_plane_even_indirectly() -> None:
    reached = imported_by(gateway_modules())
    control = {module for module in reached if module.split(".")[:2] == ["llmgw", "control"]}
    # Where the way in is: a module outside the control plane importing one inside it.
    doors = sorted(f"{reached[m]} imports {m}" for m in control if reached[m] not in control)
    assert doors == [], f"the gateway reaches the control plane: {', '.join(doors)}"


def test_the_check_sees_a_dependency_through_another_module() -> None:
    """Guards the test above against passing because it follows nothing."""
    reached = imported_by(["llmgw.gateway.router"])
    assert reached["llmgw.catalog"] == "llmgw.gateway.router"
    assert reached["llmgw.store.catalog"] == "llmgw.catalog"
    assert "llmgw.control.reconciler" in imported_by(["llmgw.roles.server"])
