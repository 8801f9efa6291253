"""Where a key is in a YAML file: the one lookup config errors and catalog checks both print.

An error names `server.yaml:7` because the operator fixes the file, not the
structured value; ruamel.yaml's round-trip nodes remember the line of every key
and list item, and this is the only code that reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq


def line_of(root: Any, path: Sequence[str | int]) -> int | None:
    """The line (from 1) of the deepest key or item on path the file has; None when it has none of it."""
    line: int | None = None
    node = root
    for part in path:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
            node = node[part]
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
            node = node[part]
        else:
            break
    return line


def where(source: str, root: Any, path: Sequence[str | int]) -> str:
    """`server.yaml:7` for the key at path, or `server.yaml` alone when the file does not have it."""
    line = line_of(root, path)
    return f"{source}:{line}" if line else source


def dotted(path: Sequence[str | int]) -> str:
    """The key as an operator would search the file for it: `models[0].profiles[1].engine`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
