"""JSON Schemas generated from attrs classes: what the admin API's OpenAPI components are made of."""

from __future__ import annotations

from typing import Literal

import attrs
import pytest

from llmgw.adminapi.schema import components


@attrs.frozen
class _Disk:
    """A disk."""

    free_bytes: int


@attrs.frozen
class _Machine:
    name: str = attrs.field(metadata={"doc": "Its host name."})
    state: Literal["up", "down"]
    disk: _Disk | None
    load: dict[str, float]
    tags: list[str]
    lines: Literal[100, 300]


class TestComponents:
    def test_a_fields_doc_becomes_its_description_and_a_literal_an_enum_of_its_values_type(self):
        machine = components([_Machine])["_Machine"]
        assert machine["properties"]["name"] == {"type": "string", "description": "Its host name."}
        assert machine["properties"]["state"] == {"type": "string", "enum": ["up", "down"]}
        assert machine["properties"]["load"] == {"type": "object", "additionalProperties": {"type": "number"}}
        assert machine["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
        assert machine["properties"]["lines"] == {"type": "integer", "enum": [100, 300]}

    def test_a_field_that_may_be_none_is_required_and_nullable_since_null_says_not_reported(self):
        machine = components([_Machine])["_Machine"]
        assert machine["required"] == ["name", "state", "disk", "load", "tags", "lines"]
        assert machine["properties"]["disk"] == {
            "oneOf": [{"$ref": "#/components/schemas/_Disk"}, {"type": "null"}]
        }
        assert machine["additionalProperties"] is False

    def test_a_class_a_field_holds_is_a_component_of_its_own_described_by_its_docstring(self):
        schemas = components([_Machine])
        # The shared schemas of names (ScopeName, ModelName) are always there; the classes follow.
        assert [name for name in schemas if name.startswith("_")] == ["_Disk", "_Machine"]
        assert schemas["_Disk"]["description"] == "A disk."

    def test_a_type_with_no_json_schema_is_refused_naming_it(self):
        @attrs.frozen
        class Odd:
            when: bytes

        with pytest.raises(TypeError, match="no JSON Schema for <class 'bytes'>"):
            components([Odd])
