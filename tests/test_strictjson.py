"""llmgw writes JSON only through llmgw.strictjson, which never writes Infinity or NaN."""

from __future__ import annotations

import ast
import io
import json
import math
from pathlib import Path

import pytest

import llmgw
from llmgw import strictjson

SRC = Path(llmgw.__file__).parent
# What writes JSON past strictjson: Python's own writers, and aiohttp's reply that calls them.
_WRITERS = {("json", "dumps"), ("json", "dump"), ("web", "json_response"), ("aiohttp.web", "json_response")}


def _strict_loads(text: str) -> object:
    def refuse(constant: str) -> float:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


class TestWriting:
    @pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
    def test_an_infinite_or_nan_float_is_refused_not_written(self, value: float) -> None:
        with pytest.raises(ValueError):
            strictjson.dumps({"cost": value})
        out = io.StringIO()
        with pytest.raises(ValueError):
            strictjson.dump([value], out)
        assert out.getvalue() == ""
        with pytest.raises(ValueError):
            strictjson.response({"cost": value})

    def test_finite_values_are_written_as_json_dumps_writes_them(self) -> None:
        value = {"b": [1, 2.5, 1e300], "a": "é", "c": None}
        for options in ({}, {"indent": 2, "sort_keys": True}, {"ensure_ascii": False}):
            assert strictjson.dumps(value, **options) == json.dumps(value, **options)  # type: ignore[arg-type]
        reply = strictjson.response(value, status=201, headers={"X-A": "1"})
        assert reply.status == 201 and reply.headers["X-A"] == "1"
        assert reply.content_type == "application/json"
        assert isinstance(reply.body, bytes) and _strict_loads(reply.body.decode()) == value


def _writers_outside_strictjson(path: Path, root: Path = SRC.parent) -> list[str]:
    """Each call in path to a JSON writer other than strictjson's, as file:line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # `from json import dumps` and `from aiohttp.web import json_response` too.
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (node.module or "", alias.name) in _WRITERS
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        named = (
            (ast.unparse(func.value), func.attr) in _WRITERS
            if isinstance(func, ast.Attribute)
            else isinstance(func, ast.Name) and func.id in imported
        )
        if named or (isinstance(func, ast.Attribute) and func.attr == "JSONEncoder"):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_nothing_in_llmgw_writes_json_but_through_strictjson() -> None:
    """json.dumps and aiohttp's json_response write Infinity and NaN, which no other JSON reader takes."""
    found = [
        where
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "strictjson.py" and "proto" not in path.relative_to(SRC).parts
        for where in _writers_outside_strictjson(path)
    ]
    assert found == [], "write JSON with llmgw.strictjson: " + ", ".join(found)


def test_the_scan_finds_each_way_of_writing_json(tmp_path: Path) -> None:
    """Guards the test above against passing because it recognises nothing."""
    module = tmp_path / "probe.py"
    module.write_text(
        "import json\nfrom json import dumps as d\nfrom aiohttp import web\n"
        "json.dumps(1)\nd(1)\nweb.json_response(1)\njson.dump(1, None)\n",
        encoding="utf-8",
    )
    assert _writers_outside_strictjson(module, tmp_path) == [f"probe.py:{n}" for n in (4, 5, 6, 7)]
