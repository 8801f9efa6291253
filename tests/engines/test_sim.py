"""The sim engine answers like an OpenAI-compatible engine, deterministically."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from llmgw.engines.sim_server import DEFAULT_MAX_TOKENS, make_sim_app

Client = TestClient[Any, Any]
MakeClient = Callable[..., Awaitable[Client]]


@pytest.fixture
async def sim(aiohttp_client: MakeClient) -> Client:
    return await aiohttp_client(make_sim_app("sim-chat"))


def _events(body: str) -> list[Any]:
    """The data of every server-sent event, JSON-decoded, with "[DONE]" left as text."""
    assert body.endswith("\n\n")
    events = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-chat", "messages": [{"role": "user", "content": content}], **extra}


async def _metric(sim: Client, name: str) -> float:
    text = await (await sim.get("/metrics")).text()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics:\n{text}")


class TestChat:
    async def test_the_reply_echoes_the_last_message_and_counts_words_as_tokens(
        self, sim: TestClient[Any, Any]
    ) -> None:
        body = {
            "model": "sim-chat",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello  there\nworld"}]},
            ],
        }
        response = await sim.post("/v1/chat/completions", json=body)
        assert response.status == 200
        reply = await response.json()
        assert reply["object"] == "chat.completion"
        assert reply["model"] == "sim-chat"
        choice = reply["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": "hello there world"}
        assert choice["finish_reason"] == "stop"
        assert reply["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}

    async def test_max_tokens_cuts_the_reply_with_finish_reason_length(
        self, sim: TestClient[Any, Any]
    ) -> None:
        response = await sim.post("/v1/chat/completions", json=_chat("a b c d e", max_tokens=2))
        reply = await response.json()
        assert reply["choices"][0]["message"]["content"] == "a b"
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"]["completion_tokens"] == 2

    async def test_max_tokens_defaults_to_sixteen(self, sim: Client) -> None:
        words = " ".join(f"w{i}" for i in range(40))
        reply = await (await sim.post("/v1/chat/completions", json=_chat(words))).json()
        assert reply["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS == 16
        assert reply["choices"][0]["finish_reason"] == "length"

    async def test_the_same_request_gets_the_same_text(self, sim: Client) -> None:
        replies = [
            await (await sim.post("/v1/chat/completions", json=_chat("say it again"))).json()
            for _ in range(2)
        ]
        assert replies[0]["choices"] == replies[1]["choices"]

    async def test_a_streamed_reply_ends_with_a_usage_chunk_when_asked(
        self, sim: TestClient[Any, Any]
    ) -> None:
        body = _chat('quote " back\\slash % ünï', stream=True, stream_options={"include_usage": True})
        response = await sim.post("/v1/chat/completions", json=body)
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = _events(await response.text())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == 'quote " back\\slash % ünï'
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        # The other chunks are the bytes they would be without usage, as vLLM and llama-server send them.
        assert all("usage" not in c for c in chunks[:-1])
        assert chunks[-1]["choices"] == []
        # "ünï": a token per character outside ASCII, as a real tokenizer roughly counts it.
        assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 7, "total_tokens": 14}

    @pytest.mark.parametrize(
        ("text", "tokens"),
        [("a " * 1000, 1000), ("汉字很难" * 100, 400), ("🙂🎉" * 50, 100), ("well, hello", 2)],
    )
    async def test_a_token_is_an_ascii_run_or_one_character_outside_ascii_never_more_than_its_bytes(
        self, sim: Client, text: str, tokens: int
    ) -> None:
        response = await sim.post("/v1/chat/completions", json=_chat(text, max_tokens=1))
        usage = (await response.json())["usage"]
        assert usage["prompt_tokens"] == tokens
        assert tokens <= len(text.encode())

    async def test_a_streamed_reply_has_no_usage_unless_asked(self, sim: Client) -> None:
        response = await sim.post(
            "/v1/chat/completions", json=_chat("one two three", stream=True, max_tokens=2)
        )
        events = _events(await response.text())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all("usage" not in c for c in chunks)
        assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "one", " two", None]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    async def test_an_empty_message_streams_a_role_and_a_stop(self, sim: Client) -> None:
        response = await sim.post("/v1/chat/completions", json=_chat("", stream=True))
        chunks = _events(await response.text())[:-1]
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "stop"]

    async def test_paced_streaming_sends_the_same_events(self, aiohttp_client: MakeClient) -> None:
        paced = await aiohttp_client(make_sim_app("sim-chat", ttft_ms=5, tokens_per_s=2000))
        response = await paced.post("/v1/chat/completions", json=_chat("a b c", stream=True))
        assert response.headers.get("Transfer-Encoding") == "chunked"
        chunks = _events(await response.text())[:-1]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "a b c"

    async def test_the_official_openai_client_reads_replies_and_streams(
        self, sim: TestClient[Any, Any]
    ) -> None:
        client = openai.AsyncOpenAI(base_url=str(sim.make_url("/v1")), api_key="unused", max_retries=0)
        async with client:
            reply = await client.chat.completions.create(
                model="sim-chat", messages=[{"role": "user", "content": "hi there"}]
            )
            assert reply.choices[0].message.content == "hi there"
            assert reply.usage is not None and reply.usage.total_tokens == 4
            stream = await client.chat.completions.create(
                model="sim-chat",
                messages=[{"role": "user", "content": "hi there"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi there"
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
            models = await client.models.list()
            assert [m.id for m in models.data] == ["sim-chat"]


class TestCompletions:
    async def test_a_completion_echoes_the_prompt_with_usage(self, sim: Client) -> None:
        response = await sim.post(
            "/v1/completions", json={"model": "sim-chat", "prompt": "x y z", "max_tokens": 2}
        )
        reply = await response.json()
        assert reply["object"] == "text_completion"
        assert reply["choices"][0]["text"] == "x y"
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}

    async def test_a_streamed_completion_ends_with_usage_and_done(self, sim: Client) -> None:
        body = {"prompt": "x y", "stream": True, "stream_options": {"include_usage": True}}
        events = _events(await (await sim.post("/v1/completions", json=body)).text())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "x y"
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


class TestErrors:
    async def test_malformed_json_is_refused_in_openais_shape(self, sim: Client) -> None:
        response = await sim.post("/v1/chat/completions", data=b"{nope")
        assert response.status == 400
        error = (await response.json())["error"]
        assert error["type"] == "invalid_request_error"
        assert "not valid JSON" in error["message"]

    async def test_another_model_is_not_found(self, sim: Client) -> None:
        response = await sim.post("/v1/chat/completions", json={**_chat("hi"), "model": "gpt-9"})
        assert response.status == 404
        error = (await response.json())["error"]
        assert error["code"] == "model_not_found"
        assert "gpt-9" in error["message"]

    @pytest.mark.parametrize("max_tokens", [0, -1, "8", True])
    async def test_a_max_tokens_that_is_not_a_positive_number_is_refused(
        self, sim: Client, max_tokens: Any
    ) -> None:
        response = await sim.post("/v1/chat/completions", json=_chat("hi", max_tokens=max_tokens))
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "max_tokens"

    async def test_a_chat_without_messages_is_refused(self, sim: Client) -> None:
        response = await sim.post("/v1/chat/completions", json={"model": "sim-chat"})
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "messages"


class TestServing:
    async def test_health_and_models_answer(self, sim: Client) -> None:
        assert (await sim.get("/health")).status == 200
        models = await (await sim.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["sim-chat"]

    async def test_metrics_count_requests_and_show_those_in_flight(self, aiohttp_client: MakeClient) -> None:
        slow = await aiohttp_client(make_sim_app("sim-chat", ttft_ms=1000))
        assert await _metric(slow, "llmgw_sim_requests_in_flight") == 0
        request = asyncio.create_task(slow.post("/v1/chat/completions", json=_chat("hi")))
        deadline = time.monotonic() + 10
        while await _metric(slow, "llmgw_sim_requests_in_flight") != 1:
            assert time.monotonic() < deadline, "the slow request never showed as in flight"
            await asyncio.sleep(0.01)
        response = await request
        assert response.status == 200
        assert await _metric(slow, "llmgw_sim_requests_in_flight") == 0
        text = await (await slow.get("/metrics")).text()
        assert 'llmgw_sim_requests_total{endpoint="chat"} 1.0' in text

    async def test_completion_tokens_are_counted_as_they_are_produced_not_when_asked_for(
        self, aiohttp_client: MakeClient
    ) -> None:
        """What the agent's stall probe reads: a request waiting for its first token has produced none."""
        slow = await aiohttp_client(make_sim_app("sim-chat", ttft_ms=1000))
        request = asyncio.create_task(slow.post("/v1/chat/completions", json=_chat("one two three")))
        deadline = time.monotonic() + 10
        while await _metric(slow, "llmgw_sim_requests_in_flight") != 1:
            assert time.monotonic() < deadline, "the slow request never showed as in flight"
            await asyncio.sleep(0.01)
        assert await _metric(slow, "llmgw_sim_completion_tokens_total") == 0
        assert (await request).status == 200
        assert await _metric(slow, "llmgw_sim_completion_tokens_total") == 3

    def test_two_sim_apps_in_one_process_do_not_collide_on_metric_names(self) -> None:
        assert isinstance(make_sim_app("a"), web.Application)
        assert isinstance(make_sim_app("a"), web.Application)


class TestSecret:
    async def test_with_a_secret_every_path_but_health_wants_it_and_says_so_in_openais_shape(
        self, aiohttp_client: MakeClient
    ) -> None:
        guarded = await aiohttp_client(make_sim_app("sim-chat", secret="replica-secret"))
        assert (await guarded.get("/health")).status == 200
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics")):
            refused = await guarded.request(method, path, json=_chat("hi"))
            assert refused.status == 401, path
            error = (await refused.json())["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
        wrong = await guarded.post(
            "/v1/chat/completions", json=_chat("hi"), headers={"Authorization": "Bearer x"}
        )
        assert wrong.status == 401
        right = {"Authorization": "Bearer replica-secret"}
        assert (await guarded.post("/v1/chat/completions", json=_chat("hi"), headers=right)).status == 200
        assert (await guarded.get("/metrics", headers=right)).status == 200


async def test_with_slots_a_request_past_them_waits_for_one_to_finish(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]],
) -> None:
    """--slots 1: the second request's reply begins only once the first has ended, as an engine's queue."""
    sim = await aiohttp_client(make_sim_app("sim-chat", ttft_ms=20, slots=1))
    order: list[str] = []

    async def ask(name: str) -> None:
        body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with sim.post("/v1/chat/completions", json=body) as reply:
            order.append(f"{name} began")
            await reply.read()
            order.append(f"{name} ended")

    await asyncio.gather(ask("first"), ask("second"))
    assert order in (
        ["first began", "first ended", "second began", "second ended"],
        ["second began", "second ended", "first began", "first ended"],
    )
