"""The Messages, Responses, rerank and transcription routes through the whole pipeline, against the sim
engine, with the official anthropic and openai clients where they speak the API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import anthropic
import attrs
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ServerConfig, TimeoutsConfig
from llmgw.engines.base import OPENAI_APIS
from llmgw.engines.sim_apis import AUDIO_BYTES_PER_S
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.apis import AUDIO_TOKENS_PER_S, MAX_AUDIO_BODY, ModelKind
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.prompts import TEMPLATE_OVERHEAD, prompt_bound
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.translation import apis_served
from llmgw.gateway.usage import UsageRecorder
from llmgw.routes import EngineRoute
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.usage import UsageDay, usage_by_day
from llmgw.tenancy import operations as tenancy

from .conftest import MODEL, FakeReplicas

RERANK = "sim-rerank"
WHISPER = "sim-whisper"
# A model whose engine is a test's own (a stream cut in the middle).
BROKEN = "broken"
LIMIT = 64
BROKEN_WHISPER = "broken-whisper"
# A model with no replica, whose fallback is MODEL.
GONE = "gone"


@attrs.define
class Rig:
    client: TestClient[web.Request, web.Application]
    store: Store
    keys: KeyCache
    quotas: Quotas
    recorder: UsageRecorder
    key: str
    replicas: FakeReplicas
    registry: CollectorRegistry

    def anthropic(self, **kwargs: str) -> anthropic.AsyncAnthropic:
        options = kwargs or {"api_key": self.key}
        return anthropic.AsyncAnthropic(base_url=str(self.client.make_url("")), max_retries=0, **options)

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=str(self.client.make_url("/v1")), api_key=self.key, max_retries=0)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def reload(self) -> None:
        await self.keys.refresh(self.store)
        await self.quotas.refresh(self.store)

    async def usage(self) -> list[UsageDay]:
        await self.recorder.flush(self.store)
        return await usage_by_day(self.store)


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[Rig]:
    servers = {
        name: TestServer(make_sim_app(name), host="127.0.0.1", port=0) for name in (MODEL, RERANK, WHISPER)
    }
    for server in servers.values():
        await server.start_server()
    cfg = ServerConfig(
        models=[
            ModelConfig(name=MODEL, max_tokens=LIMIT),
            ModelConfig(name=RERANK, kind="rerank"),
            ModelConfig(name=WHISPER, kind="transcription", max_tokens=448),
            ModelConfig(name=BROKEN_WHISPER, kind="transcription", max_tokens=448),
            ModelConfig(name=BROKEN, timeouts=TimeoutsConfig(first_byte_s=0.5)),
            ModelConfig(name=GONE, fallbacks=[MODEL]),
        ],
        pricing={MODEL: PriceConfig(prompt_per_1k=1.0, completion_per_1k=2.0)},
    )
    catalog = Catalog(cfg)
    keys, recorder = KeyCache(), UsageRecorder()
    quotas = Quotas(recorder)
    replicas = FakeReplicas(endpoints={name: [f"http://127.0.0.1:{s.port}"] for name, s in servers.items()})
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, catalog)
    app = make_gateway_app(cfg, catalog, replicas, keys, Admission(cfg, catalog, quotas, recorder), metrics)
    plaintext, _ = await create_key(store, "k")
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        rig = Rig(client, store, keys, quotas, recorder, plaintext, replicas, registry)
        await rig.reload()
        yield rig
    for server in servers.values():
        await server.close()


def _row(rows: list[UsageDay]) -> tuple[str, int, int, int]:
    (row,) = rows
    return (row.model, row.requests, row.prompt_tokens, row.completion_tokens)


class TestMessages:
    async def test_the_anthropic_client_gets_a_message_and_its_usage_is_stored(self, rig: Rig) -> None:
        async with rig.anthropic() as client:
            reply = await client.messages.create(
                model=MODEL,
                max_tokens=3,
                system="be brief",
                messages=[{"role": "user", "content": "one two three four"}],
            )
        assert reply.content[0].type == "text" and reply.content[0].text == "one two three"
        assert reply.stop_reason == "max_tokens"
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == (6, 3)
        rows = await rig.usage()
        assert _row(rows) == (MODEL, 1, 6, 3)
        assert rows[0].cost == pytest.approx(6 / 1000 + 3 * 2 / 1000)

    async def test_a_streamed_message_is_charged_from_message_start_and_message_delta(self, rig: Rig) -> None:
        async with (
            rig.anthropic() as client,
            client.messages.stream(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hello there world"}]
            ) as stream,
        ):
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text == "hello there world"
        assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 3)
        assert _row(await rig.usage()) == (MODEL, 1, 3, 3)

    async def test_the_stream_is_passed_through_byte_for_byte(self, rig: Rig) -> None:
        body = {
            "model": MODEL,
            "max_tokens": 5,
            "stream": True,
            "messages": [{"role": "user", "content": "a b"}],
        }
        async with rig.client.post("/v1/messages", json=body, headers=rig.auth) as response:
            through = await response.read()
        engine = rig.replicas.endpoints[MODEL][0]
        async with rig.client.session.post(f"{engine}/v1/messages", json=body) as response:
            direct = await response.read()
        # The same events, ids apart (the sim numbers each message it makes).
        assert through.replace(b"msg_sim_1", b"X") == direct.replace(b"msg_sim_2", b"X")
        assert through.count(b"event: content_block_delta") == 2
        assert through.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')

    async def test_count_tokens_answers_and_costs_a_request_but_no_tokens(self, rig: Rig) -> None:
        async with rig.anthropic() as client:
            counted = await client.messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": "four words right here"}]
            )
        assert counted.input_tokens == 4
        assert _row(await rig.usage()) == (MODEL, 1, 0, 0)

    async def test_a_tool_call_round_trip_goes_through(self, rig: Rig) -> None:
        tools: list[anthropic.types.ToolParam] = [
            {
                "name": "weather",
                "description": "the weather",
                "input_schema": {"type": "object", "properties": {}},
            }
        ]
        async with rig.anthropic() as client:
            called = await client.messages.create(
                model=MODEL,
                max_tokens=8,
                tools=tools,
                tool_choice={"type": "tool", "name": "weather"},
                messages=[{"role": "user", "content": "what is the weather"}],
            )
            (use,) = called.content
            assert use.type == "tool_use" and use.name == "weather" and called.stop_reason == "tool_use"
            answered = await client.messages.create(
                model=MODEL,
                max_tokens=8,
                tools=tools,
                messages=[
                    {"role": "user", "content": "what is the weather"},
                    {"role": "assistant", "content": called.content},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
                    },
                ],
            )
        assert answered.content[0].type == "text" and answered.content[0].text == "sunny"

    async def test_the_x_api_key_header_and_a_bearer_token_both_authenticate(self, rig: Rig) -> None:
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        # Claude Code's path: a query string after it, `anthropic-version` and betas beside the key.
        headers = {"x-api-key": rig.key, "anthropic-version": "2023-06-01", "anthropic-beta": "a,b"}
        async with rig.client.post("/v1/messages?beta=true", json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
        async with rig.anthropic(auth_token=rig.key) as client:
            reply = await client.messages.create(**body)  # type: ignore[call-overload]
        assert reply.content[0].text == "hi"

    async def test_a_wrong_key_is_refused_in_anthropics_shape(self, rig: Rig) -> None:
        async with rig.anthropic(api_key="llmgw-nope") as client:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await client.messages.create(
                    model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
                )
        assert refused.value.body == {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": "the API key given is not known to this gateway",
            },
        }

    async def test_an_unknown_model_is_a_not_found_error(self, rig: Rig) -> None:
        async with rig.anthropic() as client:
            with pytest.raises(anthropic.NotFoundError, match="does not exist on this gateway"):
                await client.messages.create(
                    model="nope", max_tokens=2, messages=[{"role": "user", "content": "x"}]
                )

    @pytest.mark.parametrize(
        ("body", "said"),
        [
            # Valid chat completions, but not a Messages body: a system turn, and no max_tokens.
            (
                {
                    "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}],
                    "max_tokens": 5,
                },
                "messages[0].role is 'system'",
            ),
            (
                {"messages": [{"role": "user", "content": "hi"}]},
                "max_tokens: the Messages API requires max_tokens",
            ),
            (
                {
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                },
                "messages[0].content[0] is a 'image_url' block",
            ),
            ({"max_tokens": 5, "messages": []}, "messages must be a non-empty list"),
        ],
    )
    async def test_a_body_that_is_not_a_messages_body_is_a_400_in_anthropics_shape_counted_costing_nothing(
        self, rig: Rig, body: dict[str, object], said: str
    ) -> None:
        async with rig.client.post(
            "/v1/messages", json={"model": MODEL, **body}, headers={"x-api-key": rig.key}
        ) as response:
            assert response.status == 400
            refused = await response.json()
        assert refused["type"] == "error" and refused["error"]["type"] == "invalid_request_error"
        assert said in refused["error"]["message"]
        (row,) = await rig.usage()
        assert (row.model, row.requests, row.errors, row.prompt_tokens, row.cost) == (MODEL, 1, 1, 0, 0.0)

    async def test_a_request_past_the_tpm_limit_is_a_rate_limit_error(self, rig: Rig) -> None:
        # Its reservation is its max_tokens and its body: past the project's tpm, refused before the engine.
        await tenancy.set_quota(rig.store, "project:default", tpm=100)
        await rig.reload()
        async with rig.anthropic() as client:
            with pytest.raises(anthropic.RateLimitError) as refused:
                await client.messages.create(
                    model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "x"}]
                )
        assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]

    async def test_a_model_that_is_not_allowed_to_the_key_is_a_permission_error(
        self, rig: Rig, store: Store
    ) -> None:
        limited, _ = await create_key(store, "limited", models=[RERANK])
        await rig.reload()
        async with rig.anthropic(api_key=limited) as client:
            with pytest.raises(anthropic.PermissionDeniedError):
                await client.messages.create(
                    model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}]
                )


class TestResponses:
    async def test_the_openai_client_gets_a_response_and_its_usage_is_stored(self, rig: Rig) -> None:
        async with rig.openai() as client:
            reply = await client.responses.create(model=MODEL, input="red green blue", instructions="answer")
        assert reply.output_text == "red green blue"
        assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 3)
        assert _row(await rig.usage()) == (MODEL, 1, 4, 3)

    async def test_a_streamed_response_is_charged_from_response_completed(self, rig: Rig) -> None:
        async with (
            rig.openai() as client,
            client.responses.stream(model=MODEL, input="a b c d", max_output_tokens=2) as stream,
        ):
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert kinds.count("response.output_text.delta") == 2
        assert final.output_text == "a b" and final.status == "incomplete"
        assert _row(await rig.usage()) == (MODEL, 1, 4, 2)

    async def test_a_response_that_names_no_limit_is_held_to_the_models_max_tokens(self, rig: Rig) -> None:
        words = " ".join(f"w{i}" for i in range(LIMIT + 10))
        async with rig.openai() as client:
            reply = await client.responses.create(model=MODEL, input=words)
        assert reply.usage is not None and reply.usage.output_tokens == LIMIT
        assert reply.status == "incomplete"

    async def test_a_response_asking_past_the_models_limit_is_refused(self, rig: Rig) -> None:
        async with rig.openai() as client:
            with pytest.raises(
                openai.BadRequestError, match=rf"allows at most {LIMIT} per request \(max_output_tokens\)"
            ):
                await client.responses.create(model=MODEL, input="x", max_output_tokens=LIMIT + 1)

    async def test_a_stored_response_asked_for_by_id_is_a_404_saying_none_is_kept(self, rig: Rig) -> None:
        async with rig.openai() as client:
            with pytest.raises(openai.NotFoundError, match="the gateway keeps no responses"):
                await client.responses.retrieve("resp_123")
            with pytest.raises(openai.NotFoundError, match="send the whole conversation in `input`"):
                await client.responses.delete("resp_123")


class TestRerank:
    @pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
    async def test_documents_come_back_best_first_and_their_tokens_are_charged(
        self, rig: Rig, path: str
    ) -> None:
        body = {
            "model": RERANK,
            "query": "red fox",
            "documents": ["blue sky", "a red fox", "red"],
            "top_n": 2,
        }
        async with rig.client.post(path, json=body, headers=rig.auth) as response:
            assert response.status == 200
            reply = await response.json()
        assert [(r["index"], r["relevance_score"]) for r in reply["results"]] == [(1, 1.0), (2, 0.5)]
        assert _row(await rig.usage()) == (RERANK, 1, reply["usage"]["prompt_tokens"], 0)

    async def test_vllms_score_route_is_served(self, rig: Rig) -> None:
        body = {"model": RERANK, "text_1": "red fox", "text_2": ["red", "fox red"]}
        async with rig.client.post("/v1/score", json=body, headers=rig.auth) as response:
            reply = await response.json()
        assert [d["score"] for d in reply["data"]] == [0.5, 1.0]

    async def test_a_chat_model_asked_to_rerank_is_a_400_naming_the_routes_it_serves(self, rig: Rig) -> None:
        body = {"model": MODEL, "query": "q", "documents": ["d"]}
        async with rig.client.post("/v1/rerank", json=body, headers=rig.auth) as response:
            assert response.status == 400
            said = (await response.json())["error"]["message"]
        assert said.startswith(f"{MODEL} serves chat, not rerank: send it to /v1/chat/completions")


def _form(fields: dict[str, str], audio: bytes, boundary: str = "llmgwtestboundary") -> tuple[bytes, str]:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


class TestTranscriptions:
    async def test_the_openai_client_gets_the_text_and_the_audio_duration_is_charged(self, rig: Rig) -> None:
        audio = b"\0" * (2 * AUDIO_BYTES_PER_S)
        async with rig.openai() as client:
            reply = await client.audio.transcriptions.create(
                model=WHISPER, file=("a.wav", audio, "audio/wav")
            )
        assert reply.text == f"sim heard {len(audio)} bytes of audio"
        assert _row(await rig.usage()) == (WHISPER, 1, 2 * AUDIO_TOKENS_PER_S, 0)

    async def test_a_plain_text_reply_passes_as_it_came(self, rig: Rig) -> None:
        body, content_type = _form({"model": WHISPER, "response_format": "text"}, b"abc")
        headers = {**rig.auth, "Content-Type": content_type}
        async with rig.client.post("/v1/audio/transcriptions", data=body, headers=headers) as response:
            assert response.status == 200
            assert await response.text() == "sim heard 3 bytes of audio\n"
        # No usage in a text reply: charged what it reserved, its bytes over 15 and the model's max_tokens.
        assert _row(await rig.usage()) == (WHISPER, 1, len(body) // 15 + TEMPLATE_OVERHEAD, 448)

    async def test_a_form_over_the_bound_is_a_413_before_anything_is_counted(self, rig: Rig) -> None:
        body, content_type = _form({"model": WHISPER}, b"\0" * MAX_AUDIO_BODY)

        async def chunks() -> AsyncIterator[bytes]:
            # No Content-Length: the bound holds on what arrives, too.
            for at in range(0, len(body), 1 << 20):
                yield body[at : at + (1 << 20)]

        headers = {**rig.auth, "Content-Type": content_type}
        async with rig.client.post("/v1/audio/transcriptions", data=chunks(), headers=headers) as response:
            assert response.status == 413
            said = (await response.json())["error"]["message"]
        assert said == f"the request body is more than {MAX_AUDIO_BODY:,} bytes, the most this route takes"
        assert await rig.usage() == []

    @pytest.mark.parametrize(
        ("body", "content_type", "said"),
        [
            (b'{"model": "sim-whisper"}', "application/json", "takes a multipart/form-data form"),
            (*_form({}, b"abc"), "the form does not name a model"),
            (
                b"--x\r\nContent-Disposition: form-data; name=model\r\n\r\nsim",
                "multipart/form-data; boundary=x",
                "cut short",
            ),
        ],
    )
    async def test_a_body_that_is_not_a_form_naming_a_model_is_a_400(
        self, rig: Rig, body: bytes, content_type: str, said: str
    ) -> None:
        headers = {**rig.auth, "Content-Type": content_type}
        async with rig.client.post("/v1/audio/transcriptions", data=body, headers=headers) as response:
            assert response.status == 400
            assert said in (await response.json())["error"]["message"]


def _event(kind: str, data: dict[str, object]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


_STARTED = {"id": "m", "type": "message", "role": "assistant", "model": BROKEN, "content": []}
_MESSAGE_START = _event(
    "message_start",
    {"type": "message_start", "message": {**_STARTED, "usage": {"input_tokens": 7, "output_tokens": 1}}},
) + _event(
    "content_block_start",
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
)
_MESSAGE_DELTA = _event(
    "content_block_delta",
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
)
_RESPONSE_DELTA = _event("response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"})


async def _tokens_transcription(request: web.Request) -> web.Response:
    """A transcription reported in tokens, as OpenAI's gpt-4o-transcribe reports it."""
    usage = {"type": "tokens", "input_tokens": 30, "output_tokens": 5, "total_tokens": 35}
    return web.json_response({"text": "hello", "usage": usage})


async def _read_cut(response: aiohttp.ClientResponse) -> bytes:
    """What a client reading a stream the gateway cut has: every byte before the cut."""
    got = b""
    try:
        async for chunk in response.content.iter_any():
            got += chunk
    except aiohttp.ClientPayloadError:
        return got
    raise AssertionError("the stream ended as if it were whole")


async def _cut_stream(request: web.Request) -> web.StreamResponse:
    """A stream of two tokens that the engine breaks off in the middle of the third event."""
    if request.query.get("stall"):
        await asyncio.Event().wait()
    if request.query.get("huge"):
        usage = {"input_tokens": 10**12, "output_tokens": 10**9}
        return web.json_response({"type": "message", "role": "assistant", "content": [], "usage": usage})
    if request.query.get("refuse"):
        # llama-server's refusal on its /v1/messages: OpenAI's error object.
        error = {"error": {"code": 400, "message": "the engine says no", "type": "invalid_request_error"}}
        return web.json_response(error, status=400)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if request.path == "/v1/chat/completions":
        choice = {"index": 0, "delta": {"content": "x"}}
        chunk = (
            b"data: "
            + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]}).encode()
        )
        chunk += b"\n\n"
        await response.write(2 * chunk + b'data: {"id":"c","obj')
    elif request.path == "/v1/messages":
        await response.write(_MESSAGE_START + 2 * _MESSAGE_DELTA + b'event: content_block_delta\ndata: {"ty')
    else:
        created = b'event: response.created\ndata: {"type":"response.created","response":{"usage":null}}\n\n'
        await response.write(created + 2 * _RESPONSE_DELTA + b"event: response.output_text.delta\ndata: {")
    assert request.transport is not None
    request.transport.close()
    return response


@pytest.fixture
async def broken(rig: Rig) -> AsyncIterator[Rig]:
    app = web.Application()
    app.router.add_post("/v1/messages", _cut_stream)
    app.router.add_post("/v1/responses", _cut_stream)
    app.router.add_post("/v1/chat/completions", _cut_stream)
    app.router.add_post("/v1/audio/transcriptions", _tokens_transcription)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    rig.replicas.endpoints[BROKEN] = [f"http://127.0.0.1:{server.port}"]
    rig.replicas.endpoints[BROKEN_WHISPER] = [f"http://127.0.0.1:{server.port}"]
    yield rig
    await server.close()


async def test_an_engines_refusal_in_openais_shape_reaches_anthropics_clients_in_theirs(broken: Rig) -> None:
    body = {"model": BROKEN, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with broken.client.post("/v1/messages?refuse=1", json=body, headers=broken.auth) as response:
        assert response.status == 400
        said = await response.json()
    assert said == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "the engine says no"},
    }


async def test_a_transcription_reported_in_tokens_is_charged_its_input_and_output(broken: Rig) -> None:
    async with broken.openai() as client:
        reply = await client.audio.transcriptions.create(
            model=BROKEN_WHISPER, file=("a.wav", b"\0" * 4000, "audio/wav")
        )
    assert reply.text == "hello"
    assert _row(await broken.usage()) == (BROKEN_WHISPER, 1, 30, 5)


class TestWhatEveryRouteGets:
    async def test_a_model_without_a_replica_is_served_by_its_fallback(self, rig: Rig) -> None:
        body = {"model": GONE, "max_tokens": 4, "messages": [{"role": "user", "content": "x y"}]}
        async with rig.client.post(
            "/v1/messages", json=body, headers={**rig.auth, "x-request-id": "r-1"}
        ) as response:
            assert response.status == 200
            assert (response.headers["x-llmgw-model"], response.headers["x-request-id"]) == (MODEL, "r-1")
            assert (await response.json())["content"][0]["text"] == "x y"
        assert _row(await rig.usage()) == (GONE, 1, 2, 2)

    async def test_a_replica_that_refuses_the_connection_is_retried_on_another(self, rig: Rig) -> None:
        (live,) = rig.replicas.endpoints[MODEL]
        dead = "http://127.0.0.1:9"  # the discard port: nothing listens
        refused: list[str] = []
        loop = asyncio.get_running_loop()
        for endpoint in (dead, live):
            rig.replicas.routes[endpoint] = EngineRoute(
                node_id=endpoint,
                shard_id=endpoint,
                secret="",
                lost=loop.create_future(),
                refused=refused.append,
            )
        rig.replicas.endpoints[MODEL] = [dead, live]
        async with rig.anthropic() as client:
            # Prompts of their own: prefix affinity would send a second alike where the first went.
            for word in ("first", "second", "third"):
                reply = await client.messages.create(
                    model=MODEL, max_tokens=4, messages=[{"role": "user", "content": word}]
                )
                assert reply.content[0].text == word
        assert refused  # the dead one was tried, and left routing

    async def test_usage_an_engine_cannot_have_counted_is_held_to_the_reservation(self, broken: Rig) -> None:
        body = {"model": BROKEN, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        async with broken.client.post("/v1/messages?huge=1", json=body, headers=broken.auth) as response:
            assert response.status == 200
        (row,) = await broken.usage()
        assert (row.prompt_tokens, row.completion_tokens) == (prompt_bound(body), 5)

    async def test_an_engine_that_sends_nothing_is_a_504_in_the_routes_shape(self, broken: Rig) -> None:
        body = {"model": BROKEN, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        async with broken.client.post("/v1/messages?stall=1", json=body, headers=broken.auth) as response:
            assert response.status == 504
            said = await response.json()
        assert said["type"] == "error" and said["error"]["type"] == "api_error"
        assert "sent nothing for 0.5 s (timeouts.first_byte_s)" in said["error"]["message"]


class TestStreamsCutMidEvent:
    async def test_a_translated_stream_cut_by_its_engine_ends_with_an_error_event_in_the_clients_api(
        self, broken: Rig
    ) -> None:
        (endpoint,) = broken.replicas.endpoints[BROKEN]
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        broken.replicas.routes[endpoint] = EngineRoute(
            node_id="n1", shard_id="s1", secret="", lost=lost, refused=lambda _: None, native_apis=OPENAI_APIS
        )
        body = {
            "model": BROKEN,
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        }
        async with broken.client.post("/v1/messages", json=body, headers=broken.auth) as response:
            got = (await _read_cut(response)).decode()
        assert got.startswith("event: message_start\n")
        assert got.count("event: content_block_delta") == 2
        event, data = got.strip().split("\n\n")[-1].split("\n")
        assert event == "event: error"
        assert (
            "closed the connection mid-reply after 2 tokens"
            in json.loads(data.removeprefix("data: "))["error"]["message"]
        )
        (row,) = await broken.usage()
        # No usage from the engine: the prompt as reserved, a token per chat chunk the client had.
        assert (row.requests, row.completion_tokens) == (1, 2)

    async def test_a_messages_stream_ends_with_an_anthropic_error_event_and_charges_what_was_delivered(
        self, broken: Rig
    ) -> None:
        body = {
            "model": BROKEN,
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        }
        async with broken.client.post("/v1/messages", json=body, headers=broken.auth) as response:
            got = await _read_cut(response)
        assert got.startswith(_MESSAGE_START + 2 * _MESSAGE_DELTA)
        event, data = got[len(_MESSAGE_START + 2 * _MESSAGE_DELTA) :].decode().strip().split("\n")
        assert event == "event: error"
        error = json.loads(data.removeprefix("data: "))
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "closed the connection mid-reply after 2 tokens" in error["error"]["message"]
        # The prompt message_start reported, and a token per text delta the client had.
        assert _row(await broken.usage()) == (BROKEN, 1, 7, 2)

    async def test_an_anthropic_client_raises_the_error_event(self, broken: Rig) -> None:
        async with broken.anthropic() as client:
            with pytest.raises(anthropic.APIStatusError, match="closed the connection mid-reply"):
                async with client.messages.stream(
                    model=BROKEN, max_tokens=50, messages=[{"role": "user", "content": "x"}]
                ) as stream:
                    async for _ in stream:
                        pass

    async def test_a_responses_stream_ends_with_an_error_event_and_charges_what_was_delivered(
        self, broken: Rig
    ) -> None:
        body = {"model": BROKEN, "input": "x", "max_output_tokens": 50, "stream": True}
        async with broken.client.post("/v1/responses", json=body, headers=broken.auth) as response:
            got = (await _read_cut(response)).decode()
        last = got.strip().split("\n\n")[-1]
        event, data = last.split("\n")
        assert event == "event: error"
        error = json.loads(data.removeprefix("data: "))
        assert error["type"] == "error" and error["code"] == "engine_error"
        assert got.count("response.output_text.delta") == 2 * 2
        (row,) = await broken.usage()
        # No usage reported: the prompt as reserved, a token per delta the client had.
        assert (row.requests, row.completion_tokens) == (1, 2)
        assert row.prompt_tokens == prompt_bound(body)


class TestModels:
    async def test_the_anthropic_client_lists_and_retrieves_models_in_its_own_shape(self, rig: Rig) -> None:
        async with rig.anthropic() as client:
            page = await client.models.list()
            one = await client.models.retrieve(RERANK)
        assert [m.id for m in page.data] == [MODEL, RERANK, WHISPER, BROKEN_WHISPER, BROKEN, GONE]
        assert page.data[0].type == "model" and page.data[0].display_name == MODEL
        assert (page.first_id, page.last_id, page.has_more) == (MODEL, GONE, False)
        assert (one.id, one.type) == (RERANK, "model")

    async def test_without_anthropic_version_the_list_is_openais(self, rig: Rig) -> None:
        async with rig.openai() as client:
            models = await client.models.list()
        assert [m.object for m in models.data] == ["model"] * 6

    async def test_an_unknown_model_is_a_not_found_error_in_anthropics_shape(self, rig: Rig) -> None:
        async with rig.anthropic() as client:
            with pytest.raises(anthropic.NotFoundError) as refused:
                await client.models.retrieve("nope")
        assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


async def test_requests_are_counted_by_route(rig: Rig) -> None:
    async with rig.anthropic() as client:
        await client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
        await client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "x"}])
    async with rig.openai() as client:
        await client.responses.create(model=MODEL, input="x")
        await client.responses.create(model=MODEL, input="y")
    labels = {"model": MODEL, "served_model": MODEL, "project": "1", "status": "2xx", "code": ""}

    def counted(route: str) -> float | None:
        return rig.registry.get_sample_value("llmgw_requests_total", {**labels, "route": route})

    assert (counted("messages"), counted("count_tokens"), counted("responses"), counted("chat")) == (
        1,
        1,
        2,
        None,
    )


@pytest.fixture
async def chat_only(rig: Rig) -> AsyncIterator[Rig]:
    """The rig, its chat model's engine taken to speak OpenAI's APIs only (as an endpoint is)."""
    (endpoint,) = rig.replicas.endpoints[MODEL]
    lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    rig.replicas.routes[endpoint] = EngineRoute(
        node_id="n1", shard_id="s1", secret="", lost=lost, refused=lambda _: None, native_apis=OPENAI_APIS
    )
    yield rig


class TestTranslated:
    async def test_a_message_for_an_engine_without_the_messages_api_is_sent_as_chat(
        self, chat_only: Rig
    ) -> None:
        async with chat_only.anthropic() as client:
            reply = await client.messages.create(
                model=MODEL,
                max_tokens=3,
                system="be brief",
                messages=[{"role": "user", "content": "one two three four"}],
            )
        assert reply.id.startswith("msg_") and not reply.id.startswith("msg_sim_")
        assert reply.content[0].type == "text" and reply.content[0].text == "one two three"
        assert reply.stop_reason == "max_tokens"
        # The engine's chat usage: the system prompt and the turn, as its chat route counts them.
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == (6, 3)
        assert _row(await chat_only.usage()) == (MODEL, 1, 6, 3)

    async def test_a_streamed_message_is_built_from_chat_chunks_and_charged_their_usage(
        self, chat_only: Rig
    ) -> None:
        async with (
            chat_only.anthropic() as client,
            client.messages.stream(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hello there world"}]
            ) as stream,
        ):
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text == "hello there world"
        assert final.stop_reason == "end_turn"
        assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 3)
        assert _row(await chat_only.usage()) == (MODEL, 1, 3, 3)

    async def test_a_response_for_an_engine_without_the_responses_api_is_sent_as_chat(
        self, chat_only: Rig
    ) -> None:
        async with chat_only.openai() as client:
            reply = await client.responses.create(model=MODEL, input="red green blue", max_output_tokens=2)
            async with client.responses.stream(model=MODEL, input="a b c") as stream:
                kinds = [event.type async for event in stream]
                final = await stream.get_final_response()
        assert reply.output_text == "red green" and not reply.id.startswith("resp_sim_")
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert final.output_text == "a b c"
        rows = await chat_only.usage()
        assert (rows[0].requests, rows[0].prompt_tokens, rows[0].completion_tokens) == (2, 3 + 3, 2 + 3)

    async def test_what_chat_cannot_say_is_a_400_naming_the_field(self, chat_only: Rig) -> None:
        async with chat_only.openai() as client:
            with pytest.raises(openai.BadRequestError, match="previous_response_id") as refused:
                await client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
        assert refused.value.code == "untranslatable"


@pytest.mark.parametrize(
    ("kind", "natives", "native", "translated"),
    [
        # An endpoint outside the fleet: OpenAI's own APIs, Messages and Responses translated.
        ("chat", [OPENAI_APIS], ["chat", "completions"], ["messages", "responses"]),
        # Two profiles' engines: what both serve is native; count_tokens, untranslatable, is neither.
        (
            "chat",
            [OPENAI_APIS | {"messages", "count_tokens"}, OPENAI_APIS],
            ["chat", "completions"],
            ["messages", "responses"],
        ),
        ("rerank", [OPENAI_APIS | {"rerank"}], ["rerank"], []),
        ("chat", [], [], []),
    ],
)
def test_a_models_apis_are_its_engines_own_and_the_translated_ones(
    kind: ModelKind, natives: list[frozenset[str]], native: list[str], translated: list[str]
) -> None:
    assert apis_served(kind, natives) == (native, translated)
