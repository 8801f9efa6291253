"""Draining a node: no new requests go there, in-flight ones finish, then its replicas stop and move."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import attrs
import betterproto
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.adminapi import handlers as adminapi
from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.reconciler import Reconciler
from llmgw.gateway.app import ROUTER_KEY, make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.proto.llmgw import v1 as pb

if TYPE_CHECKING:
    from conftest import Eventually

MODEL = "sim-chat"
CFG = ServerConfig(
    models=[ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])],
    auth=AuthConfig(enabled=False),
    control=ControlConfig(drain_timeout_s=300.0),
)
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@attrs.define
class SlowEngine:
    """An upstream whose streamed replies wait on `release` after their first chunk."""

    name: str
    calls: int = 0
    release: asyncio.Event = attrs.field(factory=asyncio.Event)
    first_chunk_sent: asyncio.Event = attrs.field(factory=asyncio.Event)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.calls += 1
        if not payload.get("stream"):
            return web.json_response({"object": "chat.completion", "served_by": self.name})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        self.first_chunk_sent.set()
        await self.release.wait()
        await response.write(b'data: {"n": 2}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response


@attrs.define
class Rig:
    client: TestClient[web.Request, web.Application]
    inventory: Inventory
    reconciler: Reconciler
    clock: list[float]
    links: dict[str, Link]
    engines: dict[str, tuple[SlowEngine, str]]

    def sent(self, node: str) -> list[tuple[str, object]]:
        link = self.links[node]
        out = []
        while not link.outbox.empty():
            out.append(betterproto.which_one_of(link.outbox.get_nowait(), "kind"))
        return out


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    servers, engines = [], {}
    for name in ("a", "b"):
        engine = SlowEngine(name)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", engine.chat)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        engines[name] = (engine, f"http://127.0.0.1:{server.port}")
    clock = [1000.0]
    inventory = Inventory(grace_s=15)
    links = {}
    for node_id in ("n1", "n2"):
        running = []
        if node_id == "n1":
            running = [
                pb.ShardStatus(
                    shard_id="s1", model=MODEL, engine="sim", state="ready", endpoint=engines["a"][1]
                )
            ]
        links[node_id] = inventory.attach(
            pb.Register(node_id=node_id, engine_versions={"sim": "1"}, engines_probed=True, running=running)
        )
    catalog = Catalog(CFG)
    gateway = make_gateway_app(CFG, catalog, inventory, KeyCache())
    adminapi.install(gateway, CFG, inventory, catalog)
    in_flight = gateway[ROUTER_KEY].in_flight
    reconciler = Reconciler(CFG, inventory, catalog, in_flight=in_flight, clock=lambda: clock[0])
    try:
        async with TestClient(TestServer(gateway, host="127.0.0.1", port=0)) as client:
            yield Rig(client, inventory, reconciler, clock, links, engines)
    finally:
        for engine, _ in engines.values():
            engine.release.set()
        for server in servers:
            await server.close()


async def _stream(client: TestClient[web.Request, web.Application]) -> tuple[int, str]:
    async with client.post("/v1/chat/completions", json={**ASK, "stream": True}) as reply:
        return reply.status, await reply.text()


class TestDraining:
    async def test_in_flight_finishes_new_requests_go_elsewhere_then_the_drained_replica_stops(
        self, rig: Rig, eventually: Eventually
    ):
        slow, slow_url = rig.engines["a"]
        other, other_url = rig.engines["b"]
        await rig.reconciler.reconcile()
        assert rig.sent("n1") == [] and rig.sent("n2") == []
        in_flight = asyncio.create_task(_stream(rig.client))
        await slow.first_chunk_sent.wait()

        reply = await rig.client.post("/api/v1/nodes/n1/state", json={"state": "draining"})
        assert reply.status == 200
        # The replacement starts elsewhere at once; the draining replica keeps serving meanwhile,
        # being the only one, and is not stopped under its in-flight stream.
        await rig.reconciler.reconcile()
        assert rig.sent("n1") == []
        ((kind, start),) = rig.sent("n2")
        assert kind == "start"
        rig.inventory.shard_status(
            "n2",
            pb.ShardStatus(
                shard_id=start.shard_id, model=MODEL, engine="sim", state="ready", endpoint=other_url
            ),
        )

        # A new request goes to the replacement, not to the draining node.
        answer = await rig.client.post("/v1/chat/completions", json=ASK)
        assert answer.status == 200
        assert (await answer.json())["served_by"] == "b"
        assert (slow.calls, other.calls) == (1, 1)
        await rig.reconciler.reconcile()
        assert rig.sent("n1") == []

        # The stream in flight on the draining node completes, whole.
        slow.release.set()
        status, body = await in_flight
        assert status == 200
        assert body == 'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
        await eventually(lambda: slow_url not in rig.client.app[ROUTER_KEY].in_flight)

        # Then the drained replica is stopped, and only the replacement serves.
        await rig.reconciler.reconcile()
        ((kind, stop),) = rig.sent("n1")
        assert (kind, stop.shard_id) == ("stop", "s1")
        assert stop.reason == "node n1 is draining and nothing is in flight there"
        assert [r.shard_id for r in rig.inventory.replicas(MODEL)] == [start.shard_id]
        assert rig.inventory.ready_endpoints(MODEL) == (other_url,)

    async def test_a_request_still_in_flight_at_the_drain_timeout_does_not_hold_the_replica(self, rig: Rig):
        slow, _ = rig.engines["a"]
        _, other_url = rig.engines["b"]
        in_flight = asyncio.create_task(_stream(rig.client))
        await slow.first_chunk_sent.wait()
        rig.inventory.set_admin_state("n1", "draining")
        await rig.reconciler.reconcile()
        ((_, start),) = rig.sent("n2")
        rig.inventory.shard_status(
            "n2",
            pb.ShardStatus(
                shard_id=start.shard_id, model=MODEL, engine="sim", state="ready", endpoint=other_url
            ),
        )
        rig.clock[0] += 299.0
        await rig.reconciler.reconcile()
        assert rig.sent("n1") == []
        rig.clock[0] += 1.0
        await rig.reconciler.reconcile()
        ((kind, stop),) = rig.sent("n1")
        assert (kind, stop.shard_id) == ("stop", "s1")
        assert stop.reason == (
            "node n1 is draining and 1 request(s) were still in flight after 300 s (control.drain_timeout_s)"
        )
        slow.release.set()
        await in_flight


class TestRoutingAroundADrainingNode:
    def test_its_replicas_get_no_new_requests_while_another_serves_the_model(self):
        inventory = Inventory(grace_s=15)
        for node_id, endpoint in (("n1", "http://a"), ("n2", "http://b")):
            inventory.attach(
                pb.Register(
                    node_id=node_id,
                    running=[
                        pb.ShardStatus(
                            shard_id=node_id, model=MODEL, engine="sim", state="ready", endpoint=endpoint
                        )
                    ],
                )
            )
        inventory.set_admin_state("n1", "draining")
        assert inventory.ready_endpoints(MODEL) == ("http://b",)
        inventory.set_admin_state("n2", "draining")
        # Nothing else serves it: both go on serving until replacements are ready.
        assert sorted(inventory.ready_endpoints(MODEL)) == ["http://a", "http://b"]
        inventory.set_admin_state("n1", "ready")
        assert inventory.ready_endpoints(MODEL) == ("http://a",)
