"""No function in src/ runs to 100 lines: a body that long is steps that want names of their own."""

from __future__ import annotations

import ast
from pathlib import Path

import llmgw

SRC = Path(llmgw.__file__).parent
LIMIT = 100


def _long_functions(source: str) -> list[tuple[int, str, int]]:
    """(line, name, length) of each function or method, nested ones too, of LIMIT lines or more."""
    return [
        (node.lineno, node.name, length)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and (length := node.end_lineno - node.lineno + 1) >= LIMIT
    ]


def test_no_function_in_src_runs_to_a_hundred_lines() -> None:
    # The generated protocol code (`make proto`) is nobody's to split.
    paths = sorted(p for p in SRC.rglob("*.py") if "proto" not in p.relative_to(SRC).parts)
    long = [
        f"{path.relative_to(SRC.parent.parent)}:{line} {name} is {length} lines"
        for path in paths
        for line, name, length in _long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not long, f"functions of {LIMIT} lines or more (split each into named steps):\n" + "\n".join(long)


def test_the_check_counts_a_function_from_its_def_to_its_last_line() -> None:
    """Guards the test above against passing because it measures nothing."""
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 2))
    source = (
        f"def short():\n    pass\n\n\nasync def just_short():\n{body}\n\nasync def long():\n{body}    x = 0\n"
    )
    assert [(name, length) for _, name, length in _long_functions(source)] == [("long", LIMIT)]
