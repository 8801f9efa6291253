"""JSON as its standard has it, the only way llmgw writes JSON: no Infinity, no NaN.

Python's json writes an infinite or not-a-number float as `Infinity` or `NaN`,
which no other JSON reader takes: a price of 1e308 made a request cost inf, and
`GET /api/v1/usage` answered `"cost": Infinity`, a reply its own clients could
not parse. The numbers llmgw takes are bounded (llmgw.maxima) so that none
becomes one; should one still reach a reply, a file or a line printed for a
script, writing it fails here, loudly, rather than handing on text that is not
JSON. tests/test_strictjson.py holds that nothing in src/ writes JSON another
way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from aiohttp import web


@functools.cache
def _encoder(
    indent: int | None, sort_keys: bool, ensure_ascii: bool, separators: tuple[str, str] | None
) -> json.JSONEncoder:
    # One encoder per set of options, made once: json.dumps makes a new one on every call with options.
    return json.JSONEncoder(
        allow_nan=False,
        indent=indent,
        sort_keys=sort_keys,
        ensure_ascii=ensure_ascii,
        separators=separators,
    )


def dumps(
    value: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = True,
    separators: tuple[str, str] | None = None,
) -> str:
    """value as JSON text, as json.dumps writes it; ValueError for an infinite or NaN float in it."""
    return _encoder(indent, sort_keys, ensure_ascii, separators).encode(value)


def dump(value: Any, out: TextIO, *, indent: int | None = None) -> None:
    """value as JSON text to out; ValueError, before anything is written, for an infinite or NaN float."""
    out.write(dumps(value, indent=indent))


def response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """data as an application/json reply, as aiohttp's json_response makes one, with no Infinity or NaN."""
    # Imported here: the store and the CLI write JSON too, and `llmgw keys --help` must not load aiohttp.
    from aiohttp import web

    return web.json_response(data, status=status, headers=headers, dumps=dumps)
