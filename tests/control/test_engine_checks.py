"""The gateway's own checks of engines whose node's agent is unreachable, against engines on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.control.engine_checks import EngineChecks
from llmgw.control.inventory import READY, Inventory
from llmgw.proto.llmgw import v1 as pb

SECRET = "s3cret"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Engine:
    """An engine's /health, answering as told, recording the Authorization it was sent."""

    def __init__(self) -> None:
        self.status = 200
        self.hang = asyncio.Event()
        self.authorization: list[str] = []

    async def health(self, request: web.Request) -> web.Response:
        self.authorization.append(request.headers.get("Authorization", ""))
        if self.hang.is_set():
            await asyncio.Event().wait()
        return web.Response(status=self.status)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    fake = Engine()
    app = web.Application()
    app.router.add_get("/health", fake.health)
    async with TestServer(app, host="127.0.0.1") as server:
        yield fake, str(server.make_url("")).rstrip("/")


def _unreachable(endpoint: str) -> tuple[Inventory, Clock]:
    clock = Clock()
    inventory = Inventory(grace_s=15, clock=clock)
    status = pb.ShardStatus(
        shard_id="s1", model="sim-chat", engine="sim", state=READY, endpoint=endpoint, engine_secret=SECRET
    )
    inventory.attach(pb.Register(node_id="n1", running=[status]))
    clock.now += 16
    assert inventory.expire() == ["n1"]
    return inventory, clock


class TestEngineChecks:
    async def test_an_engine_that_answers_stays_routed_and_is_asked_with_its_secret(self, engine) -> None:
        fake, url = engine
        inventory, _ = _unreachable(url)
        async with aiohttp.ClientSession() as session:
            await EngineChecks(inventory, 1.0).check(session)
        assert inventory.ready_endpoints("sim-chat") == (url,)
        assert fake.authorization == [f"Bearer {SECRET}"]

    async def test_an_engine_that_answers_anything_but_200_leaves_saying_what_it_answered(
        self, engine
    ) -> None:
        fake, url = engine
        fake.status = 503
        inventory, _ = _unreachable(url)
        route = inventory.route(url)
        assert route is not None
        async with aiohttp.ClientSession() as session:
            await EngineChecks(inventory, 1.0).check(session)
        assert inventory.ready_endpoints("sim-chat") == ()
        assert route.lost.result().endswith("sim on n1 answered the gateway's /health with 503")

    async def test_an_engine_that_does_not_answer_within_the_interval_leaves(self, engine) -> None:
        fake, url = engine
        fake.hang.set()
        inventory, _ = _unreachable(url)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as session:
            await EngineChecks(inventory, 0.2).check(session)
        assert inventory.ready_endpoints("sim-chat") == ()

    async def test_the_engines_of_a_node_whose_agent_is_heard_from_are_left_to_it(self, engine) -> None:
        fake, url = engine
        fake.status = 500
        inventory, _ = _unreachable(url)
        inventory.touch("n1")
        async with aiohttp.ClientSession() as session:
            await EngineChecks(inventory, 1.0).check(session)
        assert fake.authorization == []
        assert inventory.ready_endpoints("sim-chat") == (url,)
