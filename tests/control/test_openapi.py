"""The OpenAPI document against the admin API's real replies, every route and every status it lists."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from llmgw.agent.discovery.host import Host
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control import adminapi
from llmgw.control.inventory import Inventory
from llmgw.control.openapi import document
from llmgw.proto.llmgw import v1 as pb

CFG = ServerConfig(models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])])
ADDED = "name: sim-big\nprofiles:\n  - engine: sim\n"
YAML = {"Content-Type": "application/yaml"}

# One reply of the API: the route as the document lists it, the status, and the JSON body.
Reply = tuple[str, str, int, Any]


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """An engine's endpoint whose /metrics answers as an engine's does."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="llamacpp:requests_processing 1\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/")


@pytest.fixture
def inventory(engine: str) -> Inventory:
    """A node that reported everything a node can, one that reported nothing, one whose stream is gone."""
    inventory = Inventory(5.0, clock=lambda: 100.0)
    host = Host(os_id="debian", os_version="12", os_codename="bookworm", id_like=("debian",), arch="amd64")
    inventory.attach(
        pb.Register(
            node_id="n1",
            engine_versions={"sim": "1", "llamacpp": "b6500"},
            engines_probed=True,
            host=host.to_proto(),
            warnings=host.warnings(),
            gpus=[
                pb.Gpu(index=0, name="H100", gpu_class="h100-80g", healthy=True),
                pb.Gpu(index=1, name="H100", gpu_class="h100-80g", healthy=False, unhealthy_reason="XID 79"),
            ],
            memory=pb.Memory(total_mb=65536, available_mb=32768),
            storage=[pb.Storage(path="/var/lib/llmgw", total_bytes=10**12, free_bytes=10**11)],
            provision=[pb.ProvisionStatus(engine="llamacpp", version="b6500", state="installing")],
            weights=[pb.Weights(source="http://m/old.gguf", path="/w/old.gguf", size_bytes=10)],
            running=[
                pb.ShardStatus(
                    shard_id="sim-chat-a", model="sim-chat", engine="sim", state="ready", endpoint=engine
                ),
                pb.ShardStatus(shard_id="sim-chat-b", model="sim-chat", engine="sim", state="starting"),
            ],
        ),
        "10.0.0.1:5000",
    )
    inventory.attach(pb.Register(node_id="n2"), "10.0.0.2:5000")
    inventory.detach(inventory.attach(pb.Register(node_id="n3"), "10.0.0.3:5000"))
    return inventory


@pytest.fixture
async def client(inventory: Inventory) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    adminapi.install(app, CFG, inventory)
    async with TestClient(TestServer(app)) as client:
        yield client


async def _answer_logs(inventory: Inventory) -> None:
    """n1's agent, answering every request for its log as an agent does."""
    link = inventory._links["n1"]
    while True:
        message = await link.outbox.get()
        if message.logs.request_id:
            inventory.logs.resolve(
                "n1",
                pb.LogsReply(
                    request_id=message.logs.request_id, lines=["started"], sources=["agent", "sim-chat-a"]
                ),
            )


async def _every_reply(client: TestClient[web.Request, web.Application], inventory: Inventory) -> list[Reply]:
    """A reply of every status of every route, asked as ctl and scripts ask."""
    replies: list[Reply] = []

    async def ask(method: str, route: str, url: str, **kwargs: Any) -> None:
        async with client.request(method, url, **kwargs) as reply:
            replies.append((method.lower(), route, reply.status, await reply.json()))

    await ask("GET", "/api/v1/status", "/api/v1/status")
    await ask("GET", "/api/v1/nodes", "/api/v1/nodes")
    logs = "/api/v1/nodes/{id}/logs"
    answering = asyncio.create_task(_answer_logs(inventory))
    try:
        await ask("GET", logs, "/api/v1/nodes/n1/logs?lines=10")
    finally:
        answering.cancel()
    await ask("GET", logs, "/api/v1/nodes/n1/logs?lines=0")
    await ask("GET", logs, "/api/v1/nodes/n9/logs")
    await ask("GET", logs, "/api/v1/nodes/n3/logs")
    inventory.logs.timeout_s = 0.05
    await ask("GET", logs, "/api/v1/nodes/n2/logs")
    state = "/api/v1/nodes/{id}/state"
    await ask("POST", state, "/api/v1/nodes/n2/state", json={"state": "cordoned"})
    await ask("POST", state, "/api/v1/nodes/n2/state", json={"state": "asleep"})
    await ask("POST", state, "/api/v1/nodes/n9/state", json={"state": "cordoned"})
    await ask("POST", state, "/api/v1/nodes/n2/state", data={"state": "cordoned"})
    await ask("GET", "/api/v1/models", "/api/v1/models")
    await ask("POST", "/api/v1/models", "/api/v1/models?file=big.yaml", data=ADDED, headers=YAML)
    await ask("POST", "/api/v1/models", "/api/v1/models?file=big.yaml", data=ADDED, headers=YAML)
    await ask("POST", "/api/v1/models", "/api/v1/models", data="name: [", headers=YAML)
    await ask(
        "POST", "/api/v1/models", "/api/v1/models", json={"name": "sim-chat", "profiles": [{"engine": "sim"}]}
    )
    await ask("POST", "/api/v1/models", "/api/v1/models", data=ADDED)
    model = "/api/v1/models/{name}"
    await ask("DELETE", model, "/api/v1/models/sim-big")
    await ask("DELETE", model, "/api/v1/models/sim-big")
    await ask("DELETE", model, "/api/v1/models/sim-chat")
    await ask("GET", "/api/v1/replicas", "/api/v1/replicas?model=sim-chat")
    metrics = "/api/v1/replicas/{shard_id}/metrics"
    await ask("GET", metrics, "/api/v1/replicas/sim-chat-a/metrics")
    await ask("GET", metrics, "/api/v1/replicas/nope/metrics")
    await ask("GET", metrics, "/api/v1/replicas/sim-chat-b/metrics")
    explain = "/api/v1/explain-placement"
    await ask("GET", explain, "/api/v1/explain-placement?model=sim-chat")
    await ask("GET", explain, "/api/v1/explain-placement")
    await ask("GET", explain, "/api/v1/explain-placement?model=gpt-9")
    await ask("POST", "/api/v1/weights/collect", "/api/v1/weights/collect", json={})
    await ask("GET", "/api/v1/openapi.json", "/api/v1/openapi.json")
    return replies


def _schema(doc: dict[str, Any], method: str, route: str, status: int) -> dict[str, Any] | None:
    """What the document says the reply holds; None for a reply it does not describe (the document itself)."""
    response = doc["paths"][route][method]["responses"][str(status)]
    content = response.get("content", {}).get("application/json")
    return None if content is None else {**content["schema"], "components": doc["components"]}


def _documented(doc: dict[str, Any]) -> set[tuple[str, str, int]]:
    return {
        (method, route, int(status))
        for route, item in doc["paths"].items()
        if route.startswith("/api/")
        for method, operation in item.items()
        for status in operation["responses"]
    }


class TestEveryReplyIsWhatTheDocumentSays:
    async def test_every_status_of_every_route_is_asked_and_its_reply_validates(
        self, client: TestClient, inventory: Inventory
    ):
        doc = document("test")
        replies = await _every_reply(client, inventory)
        assert {(method, route, status) for method, route, status, _ in replies} == _documented(doc)
        for method, route, status, body in replies:
            schema = _schema(doc, method, route, status)
            if schema is None:
                validate(body)
                continue
            try:
                jsonschema.validate(body, schema)
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{method.upper()} {route} {status} is not what the document says: {exc.message}")

    async def test_a_reply_with_a_field_more_or_less_than_its_view_does_not_validate(
        self, client: TestClient
    ):
        """What keeps the test above from passing when a view and the document part ways."""
        doc = document("test")
        schema = _schema(doc, "get", "/api/v1/nodes", 200)
        assert schema is not None
        (n1, *_) = await (await client.get("/api/v1/nodes")).json()
        jsonschema.validate([n1], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{**n1, "gpu_hours": 3}], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{k: v for k, v in n1.items() if k != "host"}], schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{**n1, "state": "asleep"}], schema)
