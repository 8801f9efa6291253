"""llmgw's imports: no module imports one that imports it back, and no layer one above it.

Imports inside functions count: a late import loads its module all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

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


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _loads(graph: dict[str, set[str]], module: str) -> set[str]:
    """What importing module runs at once: what it names, and each named module's packages above it."""
    named = graph[module]
    packages = {name.rpartition(".")[0] for name in named} | {
        ".".join(name.split(".")[:i]) for name in named for i in range(2, name.count(".") + 1)
    }
    return named | {package for package in packages if package in graph and package != module}


def _chains_from(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """Every module package's modules load, however indirectly, with one chain of imports to it."""
    chains = {name: [name] for name in graph if _within(name, package)}
    todo = sorted(chains)
    while todo:
        name = todo.pop()
        for other in sorted(_loads(graph, name)):
            if other not in chains:
                chains[other] = [*chains[name], other]
                todo.append(other)
    return chains


@attrs.frozen
class Layer:
    """A package and those above it, which it must never import, not even through another module."""

    package: str
    above: tuple[str, ...]

    def __str__(self) -> str:
        return self.package.removeprefix("llmgw.")


def _above(*names: str) -> tuple[str, ...]:
    return tuple(f"llmgw.{name}" for name in names)


# Each one a way a process stays small, or a change stays local: a gateway-only host loads no
# control plane, an agent no admin API, and a config check never opens a database.
LAYERS = [
    Layer(
        "llmgw.gateway",
        _above("control", "web", "cli", "roles", "agent", "mirror", "bundle", "serverinit", "adminapi"),
    ),
    Layer("llmgw.agent", _above("control", "gateway", "web", "cli", "roles", "adminapi")),
    # The control plane holds the fleet's state (a roll of the agents among it); the admin API and
    # the pages project it, so it can import neither, nor the roles and commands above them. (It
    # still reads the gateway's usage for its metrics.)
    Layer("llmgw.control", _above("adminapi", "web", "cli", "roles")),
    Layer("llmgw.engines", _above("control", "gateway", "web", "cli", "roles", "agent")),
    Layer(
        "llmgw.config",
        _above("store", "control", "gateway", "adminapi", "web", "cli", "roles", "agent", "tenancy"),
    ),
    Layer("llmgw.store", _above("control", "gateway", "agent", "web", "cli", "adminapi", "tenancy")),
    Layer("llmgw.tenancy", _above("control", "gateway", "web", "cli", "roles", "adminapi", "agent")),
    Layer(
        "llmgw.pricing",
        _above("gateway", "tenancy", "control", "adminapi", "web", "cli", "roles", "agent", "mirror"),
    ),
    # ctl measures with it and the admin API keeps its results: it may import neither.
    Layer("llmgw.bench", _above("control", "gateway", "web", "cli", "roles", "adminapi", "agent")),
    # Both ends of the agent stream read these words, so they can import neither end.
    Layer("llmgw.stream_words", _above("control", "agent")),
]


def _crossings(graph: dict[str, set[str]], layer: Layer) -> list[str]:
    """Each import that steps above the layer, named once by the module that makes it."""
    doors: dict[tuple[str, str], list[str]] = {}
    for name, chain in sorted(_chains_from(graph, layer.package).items()):
        upper = next((above for above in layer.above if _within(name, above)), None)
        if upper is None or any(_within(step, upper) for step in chain[:-1]):
            continue
        # `llmgw.store.url` rather than the package `llmgw.store` it loads along with it.
        held = doors.get((chain[-2], upper))
        if held is None or held[-1] not in graph[chain[-2]]:
            doors[(chain[-2], upper)] = chain
    crossings = []
    for (_, upper), chain in sorted(doors.items()):
        through = f" through {' -> '.join(chain[1:-1])}" if len(chain) > 2 else ""
        crossings.append(
            f"{chain[0]} imports {chain[-1]}{through}: {layer} sits below {upper.removeprefix('llmgw.')}"
        )
    return crossings


@pytest.mark.parametrize("layer", LAYERS, ids=str)
def test_no_layer_imports_one_above_it_even_through_another_module(layer: Layer) -> None:
    """A layer that imports one above it drags that layer into every process that only needs the lower."""
    crossings = _crossings(_graph(), layer)
    assert not crossings, "\n".join(crossings)


def test_the_layer_check_sees_an_import_through_another_module_and_a_deferred_one() -> None:
    """Guards the check above against passing because it follows nothing."""
    graph = {
        "llmgw.low": {"llmgw.middle"},
        "llmgw.middle": {"llmgw.high.part"},
        "llmgw.high": set(),
        "llmgw.high.part": set(),
    }
    (crossing,) = _crossings(graph, Layer("llmgw.low", _above("high")))
    assert crossing == "llmgw.low imports llmgw.high.part through llmgw.middle: low sits below high"
    assert "llmgw.control.reconciler" in _chains_from(_graph(), "llmgw.roles")


def test_an_import_inside_a_function_counts(tmp_path: Path) -> None:
    """A late import still loads its module: it is a crossing when it steps above the layer."""
    module = tmp_path / "late.py"
    module.write_text("def run() -> None:\n    from llmgw.control import inventory\n", encoding="utf-8")
    assert "llmgw.control.inventory" in _imports(module)
