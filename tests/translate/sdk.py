"""The official SDKs judge what the translations make: their clients read it, their types validate it.

A client is pointed at an in-process transport that answers with the translation's bytes, so the
SDK decodes the stream and accumulates the events exactly as it does against Anthropic or OpenAI.
The SDKs' own parsing is lenient (it constructs models without checking them), so every event and
reply is also validated strictly with the same types.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pydantic
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

_MESSAGE_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
# Each stream event's type, by the `type` it names: validating against the whole union would say
# what is wrong with the event as each of sixty others.
_RESPONSE_EVENTS = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def _transport(body: bytes, content_type: str) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return httpx.Client(transport=httpx.MockTransport(answer))


def sse_events(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """The (event name, data) of each event of an SSE body; each must end with a blank line."""
    assert body.endswith(b"\n\n"), body[-80:]
    events = []
    for raw in body.decode().split("\n\n")[:-1]:
        name, data = None, None
        for line in raw.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data = json.loads(value)
        assert data is not None, raw
        events.append((name, data))
    return events


def checked_message(reply: dict[str, Any]) -> Message:
    """A Messages reply as the SDK's Message, validated strictly and as the client reads it."""
    strict = Message.model_validate(reply)
    client = anthropic.Anthropic(
        api_key="k",
        base_url="http://gateway",
        http_client=_transport(json.dumps(reply).encode(), "application/json"),
    )
    read = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert read.model_dump() == strict.model_dump()
    return strict


def checked_message_stream(body: bytes) -> Message:
    """A Messages stream's final message as the SDK's stream helper accumulates it, every event validated."""
    for name, data in sse_events(body):
        assert name == data["type"], (name, data)
        if name != "error":
            _MESSAGE_EVENT.validate_python(data)
    client = anthropic.Anthropic(
        api_key="k", base_url="http://gateway", http_client=_transport(body, "text/event-stream")
    )
    with client.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        return stream.get_final_message()


def anthropic_stream_error(body: bytes) -> anthropic.APIStatusError:
    """The exception the Anthropic SDK raises reading a stream that ends in an error event."""
    client = anthropic.Anthropic(
        api_key="k", base_url="http://gateway", http_client=_transport(body, "text/event-stream")
    )
    try:
        with client.messages.stream(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            stream.get_final_message()
    except anthropic.APIStatusError as e:
        return e
    raise AssertionError("the SDK read the stream without an error")


def checked_response(reply: dict[str, Any]) -> Response:
    """A Responses reply as the SDK's Response, validated strictly and as the client reads it."""
    strict = Response.model_validate(reply)
    client = openai.OpenAI(
        api_key="k",
        base_url="http://gateway/v1",
        http_client=_transport(json.dumps(reply).encode(), "application/json"),
    )
    read = client.responses.create(model="m", input="hi")
    assert read.model_dump() == strict.model_dump()
    return strict


def response_events(body: bytes) -> list[dict[str, Any]]:
    """A Responses stream's events, each validated by the SDK's type for it, numbered from 0 in order."""
    events = []
    for name, data in sse_events(body):
        assert name == data["type"], (name, data)
        _RESPONSE_EVENTS[data["type"]].model_validate(data)
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def checked_response_stream(body: bytes) -> tuple[Response, list[Any]]:
    """A Responses stream's final response as the SDK's stream helper gives it, and its events, validated."""
    response_events(body)
    client = openai.OpenAI(
        api_key="k", base_url="http://gateway/v1", http_client=_transport(body, "text/event-stream")
    )
    with client.responses.stream(model="m", input="hi") as stream:
        events = list(stream)
        return stream.get_final_response(), events
