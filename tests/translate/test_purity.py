"""The translations are data in, data out: the gateway may call them anywhere, and a test needs no server."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import llmgw.translate

PACKAGE = Path(llmgw.translate.__file__).parent


def test_the_translations_import_only_the_standard_library_attrs_and_each_other() -> None:
    allowed = set(sys.stdlib_module_names) | {"attrs", "llmgw"}
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("llmgw"):
                    assert name.startswith("llmgw.translate"), f"{path.name} imports {name}"
