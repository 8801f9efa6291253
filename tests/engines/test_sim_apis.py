"""The sim engine's Messages, Responses, rerank and transcription routes, as their clients read them."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from llmgw.engines.sim_server import make_sim_app

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]
MODEL = "sim-chat"


@pytest.fixture
async def sim(aiohttp_client: MakeClient) -> Client:
    return await aiohttp_client(make_sim_app(MODEL, ttft_ms=1, tokens_per_s=1000))


async def test_a_messages_body_without_max_tokens_is_refused_in_anthropics_shape(sim: Client) -> None:
    reply = await sim.post(
        "/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    )
    assert reply.status == 400
    assert await reply.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


async def test_count_tokens_counts_the_system_prompt_and_every_turn(sim: Client) -> None:
    body = {
        "model": MODEL,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "one two"},
            {"role": "assistant", "content": [{"type": "text", "text": "three"}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "four five"}],
            },
        ],
    }
    reply = await sim.post("/v1/messages/count_tokens", json=body)
    assert await reply.json() == {"input_tokens": 7}


async def test_a_paced_messages_stream_sends_one_delta_per_token_between_start_and_stop(sim: Client) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "a b c"}],
    }
    reply = await sim.post("/v1/messages", json=body)
    events = [e.split("\n")[0].removeprefix("event: ") for e in (await reply.text()).strip().split("\n\n")]
    assert events == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_a_responses_stream_numbers_its_events_in_order(sim: Client) -> None:
    reply = await sim.post("/v1/responses", json={"model": MODEL, "input": "a b", "stream": True})
    data = [json.loads(e.split("\ndata: ")[1]) for e in (await reply.text()).strip().split("\n\n")]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[-1]["type"] == "response.completed"
    assert data[-1]["response"]["usage"]["output_tokens"] == 2


async def test_rerank_returns_documents_when_asked_and_keeps_ties_in_order(sim: Client) -> None:
    body = {"model": MODEL, "query": "x", "documents": [{"text": "y"}, "z"], "return_documents": True}
    reply = await (await sim.post("/v1/rerank", json=body)).json()
    assert reply["results"] == [
        {"index": 0, "relevance_score": 0.0, "document": {"text": "y"}},
        {"index": 1, "relevance_score": 0.0, "document": {"text": "z"}},
    ]


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ("text", "sim heard 64000 bytes of audio\n"),
        ("verbose_json", {"duration": 2.0, "usage": {"type": "duration", "seconds": 2.0}}),
    ],
)
async def test_a_transcription_says_its_audio_in_the_format_asked(
    sim: Client, response_format: str, expected: object
) -> None:
    form = aiohttp.FormData({"model": MODEL, "response_format": response_format})
    form.add_field("file", b"\0" * 64000, filename="a.wav", content_type="audio/wav")
    reply = await sim.post("/v1/audio/transcriptions", data=form)
    assert reply.status == 200
    if isinstance(expected, str):
        assert await reply.text() == expected
    else:
        said = await reply.json()
        assert {k: said[k] for k in ("duration", "usage")} == expected
