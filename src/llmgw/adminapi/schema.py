"""JSON Schemas (OpenAPI 3.1's dialect) generated from attrs classes.

The admin API's OpenAPI components come from its views (adminapi/views.py)
through here, rather than being written again by hand: a copy written by hand
drifted from what the handlers sent the first time a field was added.

Every field is required, since every field is in every reply; a field that
may be None is nullable, not optional: null says "not reported", and a key
that comes and goes would say nothing at all.

What the type does not say of a field a request sends (a name's pattern, a
number's minimum) is in its metadata's "schema", added to the type's (and
"required": False, where a request may leave it out): a
document that allowed a name or a negative rate the server then refused had
clients build requests the document promised would work.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import attrs

from llmgw.names import MAX_MODEL_NAME, MAX_SCOPE_NAME, MODEL_PATTERN, SCOPE_NAME_PATTERN

_SCALARS: dict[Any, dict[str, str]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}


# Strings with rules of their own, named once among the components: written once.
NAMED: dict[str, dict[str, Any]] = {
    "ScopeName": {
        "type": "string",
        "description": f"An organisation's, team's or project's name: at most {MAX_SCOPE_NAME} "
        "characters, not only spaces, with no line breaks, tabs or other control characters.",
        "minLength": 1,
        "maxLength": MAX_SCOPE_NAME,
        "pattern": SCOPE_NAME_PATTERN,
    },
    "ModelName": {
        "type": "string",
        "description": "A model's name: letters, digits and . _ - :, in parts separated by single '/'.",
        "maxLength": MAX_MODEL_NAME,
        "pattern": MODEL_PATTERN,
    },
}


def ref(cls: type) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{cls.__name__}"}


def named(name: str) -> dict[str, str]:
    """A reference to one of NAMED."""
    assert name in NAMED, name
    return {"$ref": f"#/components/schemas/{name}"}


def components(roots: typing.Iterable[type]) -> dict[str, Any]:
    """The schema of each class in roots and of every attrs class their fields hold, by class name."""
    schemas: dict[str, Any] = {name: dict(schema) for name, schema in NAMED.items()}
    pending = list(roots)
    while pending:
        cls = pending.pop(0)
        if cls.__name__ in schemas:
            continue
        schemas[cls.__name__] = _object(cls, pending)
    return dict(sorted(schemas.items()))


def _object(cls: type, pending: list[type]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    schema: dict[str, Any] = {"type": "object"}
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    properties = {}
    for field in attrs.fields(cls):
        prop = {**_schema(hints[field.name], pending), **field.metadata.get("schema", {})}
        if "doc" in field.metadata:
            prop = {**prop, "description": field.metadata["doc"]}
        properties[field.name] = prop
    # A request's field that may be left out says so in its metadata (a reply always holds every field).
    schema["required"] = [f.name for f in attrs.fields(cls) if f.metadata.get("required", True)]
    schema["properties"] = properties
    schema["additionalProperties"] = False
    return schema


def _schema(hint: Any, pending: list[type]) -> dict[str, Any]:
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    if attrs.has(hint):
        pending.append(hint)
        return ref(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        (kind,) = {_SCALARS[type(a)]["type"] for a in args}
        return {"type": kind, "enum": list(args)}
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return {"type": "array", "items": _schema(args[0], pending)}
    if origin is dict and args[0] is str:
        return {"type": "object", "additionalProperties": _schema(args[1], pending)}
    if origin in (Union, types.UnionType) and type(None) in args:
        (present,) = (a for a in args if a is not type(None))
        return {"oneOf": [_schema(present, pending), {"type": "null"}]}
    raise TypeError(f"no JSON Schema for {hint!r}: add it to adminapi/schema.py")
