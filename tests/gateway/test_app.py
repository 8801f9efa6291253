"""The gateway proxies OpenAI requests to a ready replica, streaming, and refuses in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp
import aiohttp.web
import pytest
from aiohttp.test_utils import TestServer

from llmgw.gateway.app import ROUTER_KEY

if TYPE_CHECKING:
    from conftest import FakeEngine, Gateway, GatewayFactory

MODEL = "sim-chat"
CHAT = "/v1/chat/completions"


def _error(body: dict[str, Any]) -> dict[str, Any]:
    """The error object, checked to have every field OpenAI's clients read."""
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}
    return error  # type: ignore[no-any-return]


@pytest.fixture
async def gateway(make_gateway: GatewayFactory, engine: tuple[FakeEngine, str]) -> Gateway:
    gw = await make_gateway()
    gw.replicas.endpoints[MODEL] = [engine[1]]
    return gw


class TestProxy:
    async def test_a_chat_completion_is_answered_by_the_engine(
        self, gateway: Gateway, engine: tuple[FakeEngine, str]
    ) -> None:
        resp = await gateway.client.post(CHAT, json={"model": MODEL, "messages": []}, headers=gateway.auth)
        assert resp.status == 200
        assert resp.content_type == "application/json"
        body = await resp.json()
        assert body["path"] == CHAT and body["echo"]["model"] == MODEL

    async def test_a_completion_goes_to_the_engines_completions_route(self, gateway: Gateway) -> None:
        resp = await gateway.client.post("/v1/completions", json={"model": MODEL}, headers=gateway.auth)
        assert resp.status == 200
        assert (await resp.json())["path"] == "/v1/completions"

    async def test_the_body_reaches_the_engine_byte_for_byte_and_the_key_does_not(
        self, gateway: Gateway, engine: tuple[FakeEngine, str]
    ) -> None:
        raw = b'{ "messages" : [],\n  "model":"sim-chat", "z": 1.50 }'
        headers = {**gateway.auth, "Content-Type": "application/json"}
        resp = await gateway.client.post(CHAT, data=raw, headers=headers)
        assert resp.status == 200
        ((received, received_headers),) = engine[0].received
        assert received == raw
        assert "Authorization" not in received_headers

    async def test_requests_to_an_engine_go_through_one_pooled_connection(
        self, make_gateway: GatewayFactory
    ) -> None:
        peers: list[object] = []

        async def chat(request: aiohttp.web.Request) -> aiohttp.web.Response:
            assert request.transport is not None
            peers.append(request.transport.get_extra_info("peername"))
            return aiohttp.web.json_response({"object": "chat.completion"})

        app = aiohttp.web.Application()
        app.router.add_post(CHAT, chat)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            gw = await make_gateway()
            gw.replicas.endpoints[MODEL] = [f"http://127.0.0.1:{server.port}"]
            for _ in range(3):
                resp = await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)
                assert resp.status == 200
                await resp.read()
        finally:
            await server.close()
        # A session per request would open a connection (and a port) per request.
        assert len(peers) == 3 and len(set(peers)) == 1

    async def test_an_engines_own_error_reaches_the_client_with_its_status(
        self, gateway: Gateway, engine: tuple[FakeEngine, str]
    ) -> None:
        engine[0].status = 400
        resp = await gateway.client.post(CHAT, json={"model": MODEL}, headers=gateway.auth)
        assert resp.status == 400
        assert (await resp.json())["error"]["message"] == "engine says no"

    async def test_streamed_chunks_reach_the_client_before_the_engine_has_finished(
        self, gateway: Gateway, engine: tuple[FakeEngine, str]
    ) -> None:
        fake = engine[0]
        async with asyncio.timeout(10):
            resp = await gateway.client.post(
                CHAT, json={"model": MODEL, "stream": True}, headers=gateway.auth
            )
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            first = await resp.content.readuntil(b"\n\n")
            # The engine is still held mid-reply: this chunk was not buffered.
            assert not fake.release.is_set()
            assert first == b'data: {"n": 1}\n\n'
            assert gateway.client.app[ROUTER_KEY].in_flight == {engine[1]: 1}
            fake.release.set()
            rest = await resp.read()
        assert rest == b'data: {"n": 2}\n\ndata: [DONE]\n\n'
        assert gateway.client.app[ROUTER_KEY].in_flight == {}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


async def _raw_engine(behaviour: Behaviour) -> AsyncIterator[str]:
    server = await asyncio.start_server(behaviour, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)


class TestEngineFailures:
    async def test_an_engine_that_is_down_is_a_502_naming_the_model_and_endpoint(
        self, make_gateway: GatewayFactory
    ) -> None:
        gw = await make_gateway()
        port = _closed_port()
        gw.replicas.endpoints[MODEL] = [f"http://127.0.0.1:{port}"]
        resp = await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)
        assert resp.status == 502
        error = _error(await resp.json())
        assert error["message"].startswith(f"the engine for {MODEL} at 127.0.0.1:{port} did not answer")
        assert error["type"] == "server_error"
        assert gw.client.app[ROUTER_KEY].in_flight == {}

    async def test_an_engine_that_hangs_up_without_replying_is_a_502(
        self, make_gateway: GatewayFactory
    ) -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            writer.close()

        gw = await make_gateway()
        async for url in _raw_engine(hang_up):
            gw.replicas.endpoints[MODEL] = [url]
            resp = await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)
            assert resp.status == 502
            assert "closed the connection without replying" in _error(await resp.json())["message"]

    async def test_a_stream_the_engine_cuts_short_is_cut_short_for_the_client_too(
        self, make_gateway: GatewayFactory
    ) -> None:
        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            chunk = b'data: {"n": 1}\n\n'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + f"{len(chunk):x}\r\n".encode()
                + chunk
                + b"\r\n"
            )
            await writer.drain()
            writer.close()

        gw = await make_gateway()
        async for url in _raw_engine(cut):
            gw.replicas.endpoints[MODEL] = [url]
            resp = await gw.client.post(CHAT, json={"model": MODEL, "stream": True}, headers=gw.auth)
            assert resp.status == 200
            assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
            # A clean end here would let the client take half a reply for a whole one.
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()


class TestRefusals:
    async def test_an_unknown_model_is_404_model_not_found(self, gateway: Gateway) -> None:
        resp = await gateway.client.post(CHAT, json={"model": "gpt-9"}, headers=gateway.auth)
        assert resp.status == 404
        error = _error(await resp.json())
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "'gpt-9' does not exist" in error["message"] and MODEL in error["message"]

    async def test_a_model_without_a_ready_replica_is_503_saying_why(
        self, make_gateway: GatewayFactory
    ) -> None:
        gw = await make_gateway()
        resp = await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)
        assert resp.status == 503
        error = _error(await resp.json())
        assert error["message"] == f"{MODEL} has no ready replica: 1 starting on node n1"
        assert error["type"] == "server_error"

    @pytest.mark.parametrize(
        ("raw", "says"),
        [
            (b'{"model": "sim-chat",', "not valid JSON"),
            (b"\xff\xfe{}", "not valid JSON"),
            (b'["sim-chat"]', "must be a JSON object, not list"),
            (b'{"messages": []}', "does not name a model"),
        ],
    )
    async def test_a_body_that_is_not_a_request_is_400(self, gateway: Gateway, raw: bytes, says: str) -> None:
        resp = await gateway.client.post(CHAT, data=raw, headers=gateway.auth)
        assert resp.status == 400
        error = _error(await resp.json())
        assert says in error["message"] and error["type"] == "invalid_request_error"

    async def test_an_unknown_path_is_an_openai_shaped_404(self, gateway: Gateway) -> None:
        resp = await gateway.client.post("/v1/audio/speech", json={"model": MODEL}, headers=gateway.auth)
        assert resp.status == 404
        assert "/v1/audio/speech" in _error(await resp.json())["message"]


class TestCatalogAndHealth:
    async def test_models_lists_the_catalog_in_openais_shape(self, make_gateway: GatewayFactory) -> None:
        gw = await make_gateway(models=["sim-chat", "other"])
        resp = await gw.client.get("/v1/models", headers=gw.auth)
        assert resp.status == 200
        body = await resp.json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == ["sim-chat", "other"]

    async def test_models_needs_a_key(self, gateway: Gateway) -> None:
        assert (await gateway.client.get("/v1/models")).status == 401

    async def test_health_needs_no_key(self, gateway: Gateway) -> None:
        resp = await gateway.client.get("/health")
        assert resp.status == 200
        assert json.loads(await resp.text()) == {"status": "ok"}
