"""Across hosts, the gateway side: the engine's secret instead of the client's key, a node lost mid-request.

Engines here are real HTTP servers on loopback ports (the fake engine of
conftest.py, or the sim itself); the routing table is the fake one, or the
real inventory where what matters is how it reacts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Collection, Sequence

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, RouterConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.app import ROUTER_KEY, make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.proxy import SESSION_KEY
from llmgw.proto.llmgw import v1 as pb
from llmgw.routes import EngineRoute

from .conftest import MODEL, FakeEngine, GatewayFactory

CHAT = "/v1/chat/completions"
SECRET = "the-replicas-own-secret"
HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


def _route(lost: asyncio.Future[str], refusals: list[str] | None = None) -> EngineRoute:
    return EngineRoute(
        node_id="n1",
        shard_id="s1",
        secret=SECRET,
        lost=lost,
        refused=(refusals if refusals is not None else []).append,
    )


@pytest.fixture
async def hanging_engine() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """An engine that takes the request and never answers, as one on a host that died would."""
    arrived = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        await request.read()
        arrived.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_post(CHAT, hang)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", arrived
    finally:
        await server.close()


@pytest.fixture
async def sim_engine() -> AsyncIterator[str]:
    """The sim, requiring SECRET as the agent would start it."""
    server = TestServer(make_sim_app(MODEL, secret=SECRET), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestTheSecret:
    async def test_the_engine_gets_the_replicas_secret_in_place_of_the_clients_key(
        self, make_gateway: GatewayFactory, engine: tuple[FakeEngine, str]
    ) -> None:
        fake, url = engine
        gw = await make_gateway()
        gw.replicas.endpoints[MODEL] = [url]
        gw.replicas.routes[url] = _route(asyncio.get_running_loop().create_future())
        resp = await gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth)
        assert resp.status == 200
        ((_, headers),) = fake.received
        assert headers["Authorization"] == f"Bearer {SECRET}"
        assert all(gw.key not in value for value in headers.values())

    async def test_an_engine_refuses_a_caller_without_its_secret_and_serves_the_gateway(
        self, make_gateway: GatewayFactory, sim_engine: str
    ) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(sim_engine + CHAT, json=body) as direct:
                assert direct.status == 401
                assert (await direct.json())["error"]["code"] == "invalid_api_key"
            # The client's own llmgw key is no secret of the engine's either.
            gw = await make_gateway()
            async with session.post(sim_engine + CHAT, json=body, headers=gw.auth) as with_key:
                assert with_key.status == 401
            async with session.get(sim_engine + "/health") as health:
                assert health.status == 200
        gw.replicas.endpoints[MODEL] = [sim_engine]
        gw.replicas.routes[sim_engine] = _route(asyncio.get_running_loop().create_future())
        resp = await gw.client.post(CHAT, json=body, headers=gw.auth)
        assert resp.status == 200
        assert (await resp.json())["choices"][0]["message"]["content"] == "hi"


class TestLosingANode:
    async def test_a_request_in_flight_to_a_node_declared_unreachable_is_a_502_naming_the_node(
        self, make_gateway: GatewayFactory, hanging_engine: tuple[str, asyncio.Event]
    ) -> None:
        url, arrived = hanging_engine
        gw = await make_gateway()
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        gw.replicas.endpoints[MODEL] = [url]
        gw.replicas.routes[url] = _route(lost)
        request = asyncio.create_task(gw.client.post(CHAT, json={"model": MODEL}, headers=gw.auth))
        await arrived.wait()
        lost.set_result("node n1 is unreachable (nothing from its agent for 16 s, control.grace_s is 15 s)")
        resp = await asyncio.wait_for(request, 5.0)
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == "engine_unavailable"
        assert "on node n1 was abandoned mid-request: node n1 is unreachable" in error["message"]
        assert gw.client.app[ROUTER_KEY].in_flight == {}

    async def test_a_stream_under_way_when_its_node_is_lost_is_cut_short_for_the_client(
        self, make_gateway: GatewayFactory, engine: tuple[FakeEngine, str]
    ) -> None:
        _, url = engine
        gw = await make_gateway()
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        gw.replicas.endpoints[MODEL] = [url]
        gw.replicas.routes[url] = _route(lost)
        resp = await gw.client.post(CHAT, json={"model": MODEL, "stream": True}, headers=gw.auth)
        assert resp.status == 200
        assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
        lost.set_result("node n1 is unreachable")
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(resp.read(), 5.0)

    async def test_an_engine_that_refuses_the_connection_is_a_502_naming_its_node_and_leaves_the_table(
        self,
    ) -> None:
        port = _closed_port()
        endpoint = f"http://127.0.0.1:{port}"
        inventory = Inventory(grace_s=15)
        link = inventory.attach(
            pb.Register(
                node_id="n1",
                running=[
                    pb.ShardStatus(
                        shard_id="s1",
                        model=MODEL,
                        engine="sim",
                        state="ready",
                        endpoint=endpoint,
                        engine_secret=SECRET,
                    )
                ],
            )
        )
        # Its agent is away (restarting): the gateway is the first to learn the engine went with it.
        inventory.detach(link)
        cfg = ServerConfig(models=[ModelConfig(name=MODEL)], auth=AuthConfig(enabled=False))
        client = TestClient(
            TestServer(make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache()), host="127.0.0.1", port=0)
        )
        await client.start_server()
        try:
            resp = await client.post(CHAT, json={"model": MODEL})
            assert resp.status == 502
            message = (await resp.json())["error"]["message"]
            assert message.startswith(f"the engine for {MODEL} at 127.0.0.1:{port} on node n1 did not answer")
            assert inventory.ready_endpoints(MODEL) == ()
            again = await client.post(CHAT, json={"model": MODEL})
            assert again.status == 503
        finally:
            await client.close()


def _ready(shard_id: str, endpoint: str) -> pb.ShardStatus:
    return pb.ShardStatus(
        shard_id=shard_id, model=MODEL, engine="sim", state="ready", endpoint=endpoint, engine_secret=SECRET
    )


class TestAnotherReplicaTakesOver:
    async def test_a_request_an_engine_refuses_is_served_by_another_ready_replica(
        self, sim_engine: str
    ) -> None:
        dead = f"http://127.0.0.1:{_closed_port()}"
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", dead)]))
        inventory.attach(pb.Register(node_id="n2", running=[_ready("s2", sim_engine)]))
        # Least in flight: the same prompt twice would otherwise go where it went first (prefix).
        cfg = ServerConfig(
            models=[ModelConfig(name=MODEL)],
            auth=AuthConfig(enabled=False),
            router=RouterConfig(policy="least_in_flight"),
        )
        client = TestClient(
            TestServer(make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache()), host="127.0.0.1", port=0)
        )
        await client.start_server()
        try:
            # One at a time, the router takes the two tied replicas in turn: one of the first two
            # requests is sent to the dead engine first.
            statuses = [(await client.post(CHAT, json=HELLO)).status for _ in range(2)]
            assert statuses == [200, 200]
            assert inventory.ready_endpoints(MODEL) == (sim_engine,)
        finally:
            await client.close()

    async def test_with_no_other_replica_the_refusal_is_the_answer(self) -> None:
        port = _closed_port()
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", f"http://127.0.0.1:{port}")]))
        cfg = ServerConfig(models=[ModelConfig(name=MODEL)], auth=AuthConfig(enabled=False))
        client = TestClient(
            TestServer(make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache()), host="127.0.0.1", port=0)
        )
        await client.start_server()
        try:
            resp = await client.post(CHAT, json=HELLO)
            assert resp.status == 502
            assert "on node n1 did not answer" in (await resp.json())["error"]["message"]
        finally:
            await client.close()

    async def test_when_every_replica_fails_the_answer_names_each_one_tried(self) -> None:
        # A request moved off one failing replica that then fails on the next: the client hears of
        # both, not only of the last, which it never knew it had been sent to.
        inventory = Inventory(grace_s=15)
        inventory.attach(
            pb.Register(node_id="n1", running=[_ready("s1", f"http://127.0.0.1:{_closed_port()}")])
        )
        inventory.attach(
            pb.Register(node_id="n2", running=[_ready("s2", f"http://127.0.0.1:{_closed_port()}")])
        )
        cfg = ServerConfig(
            models=[ModelConfig(name=MODEL)],
            auth=AuthConfig(enabled=False),
            router=RouterConfig(policy="least_in_flight"),
        )
        client = TestClient(
            TestServer(make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache()), host="127.0.0.1", port=0)
        )
        await client.start_server()
        try:
            resp = await client.post(CHAT, json=HELLO)
            assert resp.status == 502
            message = (await resp.json())["error"]["message"]
            last, before = message.split("; tried before: ")
            assert {"n1", "n2"} == {
                n for n in ("n1", "n2") if f"node {n}" in last or before.startswith(f"{n}: ")
            }
            assert "did not answer" in last and "did not answer" in before
        finally:
            await client.close()

    async def test_an_engine_that_dies_holding_the_request_is_said_to_be_gone_not_a_failed_connect(
        self,
    ) -> None:

        async def die(request: web.Request) -> web.StreamResponse:
            await request.read()
            # As a killed process: its port closes, and the connection it held with it.
            assert engine.runner is not None
            for site in list(engine.runner.sites):
                await site.stop()
            assert request.transport is not None
            request.transport.close()
            return web.Response()

        app = web.Application()
        app.router.add_post(CHAT, die)
        engine = TestServer(app, host="127.0.0.1", port=0)
        await engine.start_server()
        url = f"http://127.0.0.1:{engine.port}"
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", url)]))
        async with _gateway_over(inventory) as client:
            resp = await asyncio.wait_for(client.post(CHAT, json=HELLO), 10.0)
            assert resp.status == 502
            message = (await resp.json())["error"]["message"]
            assert message == (
                f"the engine for {MODEL} at {url.removeprefix('http://')} on node n1 did not answer: "
                "it closed the connection without replying, and then refused a new one (it is gone)"
            )
        await engine.close()

    async def test_a_request_the_engine_never_acknowledges_is_given_up_by_the_kernel_not_after_minutes(
        self, sim_engine: str
    ) -> None:
        """The gateway's connections to engines carry TCP_USER_TIMEOUT: a cut link fails the request."""
        cfg = ServerConfig(models=[ModelConfig(name=MODEL)], auth=AuthConfig(enabled=False))
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", sim_engine)]))
        app = make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache())
        client = TestClient(TestServer(app, host="127.0.0.1", port=0))
        await client.start_server()
        try:
            assert (await client.post(CHAT, json=HELLO)).status == 200
            session = app[SESSION_KEY]
            connector = session.connector
            assert isinstance(connector, aiohttp.TCPConnector)
            # The pooled connection the request used.
            (protocols,) = connector._conns.values()
            sock = protocols[0][0].transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
        finally:
            await client.close()


STALL = "sim on n1 stopped answering /health 3 s ago (3 probes in a row; the last: no answer within 1 s)"


def _stalled(endpoint: str) -> pb.ShardStatus:
    """What n1's agent reports of s1 before it kills the engine."""
    return pb.ShardStatus(
        shard_id="s1", model=MODEL, engine="sim", state="stalled", endpoint=endpoint, detail=STALL
    )


@contextlib.asynccontextmanager
async def _gateway_over(inventory: Inventory) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    cfg = ServerConfig(models=[ModelConfig(name=MODEL)], auth=AuthConfig(enabled=False))
    client = TestClient(
        TestServer(make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache()), host="127.0.0.1", port=0)
    )
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


class TestAReplicaReportedStalled:
    """What its agent reports stalled ends every request held there at once, not at the kill."""

    async def test_a_request_it_holds_is_served_by_another_ready_replica(
        self, hanging_engine: tuple[str, asyncio.Event], sim_engine: str
    ) -> None:
        url, arrived = hanging_engine
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", url)]))
        async with _gateway_over(inventory) as client:
            request = asyncio.create_task(client.post(CHAT, json=HELLO))
            await arrived.wait()
            inventory.attach(pb.Register(node_id="n2", running=[_ready("s2", sim_engine)]))
            inventory.shard_status("n1", _stalled(url))
            resp = await asyncio.wait_for(request, 10.0)
            assert resp.status == 200
            assert resp.headers["x-llmgw-replica"] == "s2"
            assert (await resp.json())["choices"][0]["message"]["content"] == "hello"
            assert client.app[ROUTER_KEY].in_flight == {}

    async def test_with_no_other_replica_it_is_a_502_naming_the_stall(
        self, hanging_engine: tuple[str, asyncio.Event]
    ) -> None:
        url, arrived = hanging_engine
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", url)]))
        async with _gateway_over(inventory) as client:
            request = asyncio.create_task(client.post(CHAT, json=HELLO))
            await arrived.wait()
            inventory.shard_status("n1", _stalled(url))
            resp = await asyncio.wait_for(request, 10.0)
            assert resp.status == 502
            error = (await resp.json())["error"]
            assert error["code"] == "engine_unavailable"
            at = url.removeprefix("http://")
            assert error["message"] == (
                f"the engine for {MODEL} at {at} on node n1 was abandoned mid-request: "
                f"its node reported it stalled: {STALL}"
            )

    async def test_a_stream_under_way_ends_with_an_error_event_naming_the_stall_and_what_was_delivered(
        self, engine: tuple[FakeEngine, str]
    ) -> None:
        _, url = engine
        inventory = Inventory(grace_s=15)
        inventory.attach(pb.Register(node_id="n1", running=[_ready("s1", url)]))
        async with _gateway_over(inventory) as client:
            resp = await client.post(CHAT, json={**HELLO, "stream": True})
            assert resp.status == 200
            assert await resp.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
            inventory.shard_status("n1", _stalled(url))
            rest = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in resp.content.iter_any():
                    rest += chunk
            assert rest.startswith(b"data: {") and rest.endswith(b"\n\n")
            error = json.loads(rest[len(b"data: ") :])["error"]
            assert error["message"] == (
                f"{MODEL} on n1 was abandoned mid-reply: its node reported it stalled: {STALL}; "
                "1 token had been delivered"
            )
            assert error["code"] == "engine_unavailable"


class TestCacheAwareRoutingKeepsToReadyReplicas:
    @pytest.mark.parametrize("policy", ["affinity", "prefix"])
    async def test_sessions_and_prefixes_leave_a_draining_node_and_a_refusing_engine(
        self, policy: str
    ) -> None:
        """Whatever a replica holds in its cache, a draining node or a dead engine gets no request."""
        engines = [TestServer(make_sim_app(MODEL, secret=SECRET), host="127.0.0.1", port=0) for _ in range(2)]
        for engine in engines:
            await engine.start_server()
        live = [f"http://127.0.0.1:{engine.port}" for engine in engines]
        dead = f"http://127.0.0.1:{_closed_port()}"
        inventory = Inventory(grace_s=15)
        for i, endpoint in enumerate(live):
            inventory.attach(pb.Register(node_id=f"n{i + 1}", running=[_ready(f"s{i + 1}", endpoint)]))
        cfg = ServerConfig(
            models=[ModelConfig(name=MODEL)],
            auth=AuthConfig(enabled=False),
            router=RouterConfig(policy=policy),
        )
        app = make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache())
        client = TestClient(TestServer(app, host="127.0.0.1", port=0))
        await client.start_server()
        router = app[ROUTER_KEY]
        sent: list[str] = []
        original = router.route

        def spying(
            model: str, session: str = "", blocks: Sequence[int] = (), tried: Collection[str] = ()
        ) -> tuple[str, str]:
            served = original(model, session, blocks, tried)
            sent.append(served[1])
            return served

        router.route = spying  # type: ignore[method-assign]

        async def conversations(who: str = "user") -> None:
            for i in range(12):
                body = {
                    "model": MODEL,
                    "messages": [
                        {"role": "system", "content": f"{who} policy " * 80},
                        {"role": "user", "content": f"{i}"},
                    ],
                    "user": f"{who}-{i}",
                }
                resp = await client.post(CHAT, json=body)
                assert resp.status == 200, await resp.text()

        try:
            await conversations()
            assert set(sent) == set(live)
            inventory.set_admin_state("n1", "draining")
            sent.clear()
            await conversations()
            assert set(sent) == {live[1]}
            # n1 back, and a third node whose engine is gone: new conversations sent there are
            # served by another replica, and the dead one leaves the table at its first refusal.
            inventory.set_admin_state("n1", "ready")
            inventory.attach(pb.Register(node_id="n3", running=[_ready("s3", dead)]))
            sent.clear()
            for who in ("ann", "bob", "cat", "dan"):
                await conversations(who)
            assert sent.count(dead) == 1
            assert set(inventory.ready_endpoints(MODEL)) == set(live)
        finally:
            await client.close()
            for engine in reversed(engines):
                await engine.close()
