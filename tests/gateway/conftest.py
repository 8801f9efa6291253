"""A fake engine on a loopback port, a fake routing table and a gateway in front of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.control.routes import EngineRoute
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key

MODEL = "sim-chat"


@attrs.define
class FakeReplicas:
    """The ReplicaTable the inventory provides, set by hand."""

    endpoints: dict[str, list[str]] = attrs.field(factory=dict)
    why: str = f"{MODEL} has no ready replica: 1 starting on node n1"
    # Endpoint -> its node, secret and lost signal; none by default (a gateway without a control plane).
    routes: dict[str, EngineRoute] = attrs.field(factory=dict)

    def ready_endpoints(self, model: str) -> Sequence[str]:
        return self.endpoints.get(model, [])

    def why_no_ready(self, model: str) -> str:
        return self.why

    def route(self, endpoint: str) -> EngineRoute | None:
        return self.routes.get(endpoint)


@attrs.define
class FakeEngine:
    """An OpenAI-ish engine that records what it received; a streamed reply waits on `release`."""

    received: list[tuple[bytes, dict[str, str]]] = attrs.field(factory=list)
    release: asyncio.Event = attrs.field(factory=asyncio.Event)
    first_chunk_sent: asyncio.Event = attrs.field(factory=asyncio.Event)
    status: int = 200

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append((body, dict(request.headers)))
        payload = json.loads(body)
        if self.status != 200:
            error = {"error": {"message": "engine says no", "type": "invalid_request_error"}}
            return web.json_response(error, status=self.status)
        if not payload.get("stream"):
            return web.json_response({"object": "chat.completion", "path": request.path, "echo": payload})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        self.first_chunk_sent.set()
        await self.release.wait()
        await response.write(b'data: {"n": 2}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_post("/v1/completions", fake.chat)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield fake, f"http://127.0.0.1:{server.port}"
    finally:
        # A test that failed before releasing must not leave the engine waiting forever.
        fake.release.set()
        await server.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@attrs.define
class Gateway:
    client: TestClient[web.Request, web.Application]
    replicas: FakeReplicas
    keys: KeyCache
    store: Store
    key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def make_gateway(store: Store) -> AsyncIterator[GatewayFactory]:
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(*, auth: bool = True, models: Sequence[str] = (MODEL,)) -> Gateway:
        cfg = ServerConfig(models=[ModelConfig(name=name) for name in models], auth=AuthConfig(enabled=auth))
        replicas = FakeReplicas()
        plaintext, _ = await create_key(store, "test")
        keys = KeyCache()
        await keys.refresh(store)
        client = TestClient(TestServer(make_gateway_app(cfg, replicas, keys), host="127.0.0.1", port=0))
        await client.start_server()
        clients.append(client)
        return Gateway(client=client, replicas=replicas, keys=keys, store=store, key=plaintext)

    yield make
    for client in clients:
        await client.close()
