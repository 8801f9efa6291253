"""The routing table the leader publishes through a real PostgreSQL, and standbys routing by it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.ha.leadership import Leadership, while_leading
from llmgw.control.ha.publish import FleetRoutes, Published, RoutingTable
from llmgw.control.inventory import Inventory
from llmgw.engines.registry import ENGINES
from llmgw.proto.llmgw import v1 as pb

from ...waiting import eventually

pytestmark = pytest.mark.slow

MODEL = "sim-chat"
ELECTED_S = 10.0
CFG = ServerConfig(models=[ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])])


def ready(node: str, shard: str, port: int, secret: str) -> pb.ShardStatus:
    return pb.ShardStatus(
        shard_id=shard,
        model=MODEL,
        engine="sim",
        state="ready",
        endpoint=f"http://127.0.0.1:{port}",
        engine_secret=secret,
    )


class Plane:
    """One control plane's election and routing table, as the server role wires them."""

    def __init__(
        self, url: str, name: str, grace_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inventory = Inventory(grace_s=grace_s, clock=clock)
        self.leadership = Leadership(url, name, f"127.0.0.1:{7443 if name == 'cp1' else 7444}", poll_s=0.1)
        self.routes = FleetRoutes(self.inventory, self.leadership, Catalog(CFG), grace_s)
        self.settled = asyncio.Event()

    async def lead(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.routes.publish())
            await self.routes.lead()
            self.settled.set()


@contextlib.asynccontextmanager
async def running(plane: Plane) -> AsyncIterator[Plane]:
    async with plane.leadership:
        tasks = [
            asyncio.create_task(plane.routes.follow()),
            asyncio.create_task(while_leading(plane.leadership, plane.lead)),
        ]
        try:
            yield plane
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class TestPublishing:
    async def test_a_replica_ready_on_the_leader_reaches_the_standbys_router_within_a_second(
        self, postgres_url: str
    ) -> None:
        async with running(Plane(postgres_url, "cp1")) as leader:
            await eventually(lambda: leader.leadership.leading, ELECTED_S)
            await eventually(lambda: leader.settled.is_set())
            async with running(Plane(postgres_url, "cp2")) as standby:
                await eventually(lambda: standby.leadership.leader is not None, ELECTED_S)
                assert not standby.leadership.leading
                assert standby.routes.ready_endpoints(MODEL) == ()
                assert "no ready replica" in standby.routes.why_no_ready(MODEL)

                registered = time.monotonic()
                leader.inventory.attach(
                    pb.Register(node_id="n1", running=[ready("n1", "s1", 9101, "sekrit")])
                )
                await eventually(lambda: standby.routes.ready_endpoints(MODEL), 1.0)
                print(f"the standby routed to it {time.monotonic() - registered:.3f} s after it was ready")
                assert standby.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9101",)
                route = standby.routes.route("http://127.0.0.1:9101")
                assert route is not None
                # The engine admits only the replica's secret: the standby presents the same one.
                assert (route.node_id, route.shard_id, route.secret) == ("n1", "s1", "sekrit")

                # And the replica leaving the leader's table leaves the standby's.
                leader.inventory.shard_status(
                    "n1", pb.ShardStatus(shard_id="s1", model=MODEL, state="stopped")
                )
                await eventually(lambda: not standby.routes.ready_endpoints(MODEL), 1.0)

    async def test_a_standby_reads_the_whole_table_again_after_losing_its_connection(
        self, postgres_url: str
    ) -> None:
        async with running(Plane(postgres_url, "cp1")) as leader:
            await eventually(lambda: leader.settled.is_set(), ELECTED_S)
            async with running(Plane(postgres_url, "cp2")) as standby:
                await eventually(lambda: standby.routes.generation > 0, ELECTED_S)
                # The standby's connection is cut, and a change is published while it is away.
                admin = await asyncpg.connect(postgres_url)
                try:
                    await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = 'llmgw cp2'"
                    )
                    leader.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9102, "x")]))
                finally:
                    await admin.close()
                await eventually(lambda: standby.routes.ready_endpoints(MODEL), ELECTED_S)
                assert standby.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9102",)

    async def test_an_engine_that_refuses_a_standby_is_not_routed_to_until_the_leader_publishes_again(
        self, postgres_url: str
    ) -> None:
        async with running(Plane(postgres_url, "cp1")) as leader:
            await eventually(lambda: leader.settled.is_set(), ELECTED_S)
            leader.inventory.attach(
                pb.Register(
                    node_id="n1", running=[ready("n1", "s1", 9103, "a"), ready("n1", "s2", 9104, "b")]
                )
            )
            async with running(Plane(postgres_url, "cp2")) as standby:
                await eventually(lambda: len(standby.routes.ready_endpoints(MODEL)) == 2, ELECTED_S)
                route = standby.routes.route("http://127.0.0.1:9103")
                assert route is not None
                route.refused("connection refused")
                assert standby.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9104",)
                leader.inventory.attach(pb.Register(node_id="n2", running=[ready("n2", "s3", 9105, "c")]))
                await eventually(lambda: len(standby.routes.ready_endpoints(MODEL)) == 3, ELECTED_S)

    async def test_a_request_in_flight_through_a_standby_is_abandoned_when_the_leader_loses_its_engine(
        self, postgres_url: str
    ) -> None:
        """As on the leader: kept while only the agent is lost; a 502 once its engine stops answering too."""
        now = [1000.0]
        async with running(Plane(postgres_url, "cp1", clock=lambda: now[0])) as leader:
            await eventually(lambda: leader.settled.is_set(), ELECTED_S)
            leader.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9108, "k")]))
            async with running(Plane(postgres_url, "cp2")) as standby:
                await eventually(lambda: standby.routes.ready_endpoints(MODEL), ELECTED_S)
                route = standby.routes.route("http://127.0.0.1:9108")
                assert route is not None
                now[0] += 60
                assert leader.inventory.expire() == ["n1"]
                await eventually(lambda: "n1" in standby.routes.published.unreachable, ELECTED_S)
                assert not route.lost.done()
                assert standby.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9108",)
                leader.inventory.engine_gone(
                    "s1", "sim on n1 did not answer the gateway's /health within 5 s"
                )
                await eventually(lambda: route.lost.done(), ELECTED_S)
                assert route.lost.result() == (
                    "node n1's agent is unreachable and its engine stopped answering the leader"
                )
                assert standby.routes.ready_endpoints(MODEL) == ()

    async def test_a_request_in_flight_through_a_standby_ends_when_the_leaders_agent_reports_it_stalled(
        self, postgres_url: str
    ) -> None:
        async with running(Plane(postgres_url, "cp1")) as leader:
            await eventually(lambda: leader.settled.is_set(), ELECTED_S)
            leader.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9109, "k")]))
            async with running(Plane(postgres_url, "cp2")) as standby:
                await eventually(lambda: standby.routes.ready_endpoints(MODEL), ELECTED_S)
                route = standby.routes.route("http://127.0.0.1:9109")
                assert route is not None
                stall = "sim on n1 stopped answering /health 3 s ago (3 probes in a row; the last: timed out)"
                stalled = ready("n1", "s1", 9109, "k")
                stalled.state, stalled.detail = "stalled", stall
                leader.inventory.shard_status("n1", stalled)
                # Often killed and failed before the table goes out: that ends it too, saying so.
                failed = ready("n1", "s1", 9109, "k")
                failed.state, failed.detail = "failed", f"stalled, so its process group was killed: {stall}"
                leader.inventory.shard_status("n1", failed)
                await eventually(lambda: route.lost.done(), ELECTED_S)
                assert (
                    route.lost.result()
                    == f"its node reported it failed: stalled, so its process group was killed: {stall}"
                )
                assert standby.routes.ready_endpoints(MODEL) == ()


class TestStarting:
    async def test_a_server_started_beside_a_leader_has_its_table_once_its_first_look_is_done(
        self, postgres_url: str
    ) -> None:
        """What the server role waits for before its gateway listens: a roll restarts servers under
        traffic, and a gateway without the table would answer "no ready replica"."""
        async with running(Plane(postgres_url, "cp1")) as leader:
            await eventually(lambda: leader.leadership.leading, ELECTED_S)
            await eventually(lambda: leader.settled.is_set())
            leader.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9101, "sekrit")]))
            await eventually(lambda: leader.routes.published.ready.get(MODEL), ELECTED_S)
            async with running(Plane(postgres_url, "cp2")) as standby:
                assert await standby.routes.first_look(ELECTED_S)
                assert standby.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9101",)

    async def test_the_first_look_is_done_when_nothing_was_ever_published(self, postgres_url: str) -> None:
        async with running(Plane(postgres_url, "cp1")) as first:
            assert await first.routes.first_look(ELECTED_S)


class TestSteppingDown:
    async def test_a_leader_routes_by_what_it_published_once_it_stops_leading_without_reading_it_back(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        plane = Plane(postgres_url, "cp1")
        # No follow(): the leader never reads its publication back, as when PostgreSQL goes away
        # between the publication and its notification.
        async with plane.leadership:
            leading = asyncio.create_task(while_leading(plane.leadership, plane.lead))
            try:
                await eventually(lambda: plane.settled.is_set(), ELECTED_S)
                plane.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9105, "x")]))
                # Published: its own table, though it never read it back.
                await eventually(lambda: MODEL in plane.routes.published.ready, ELECTED_S)
                # It steps down (its lock's connection lost): the gateway routes as a standby does.
                monkeypatch.setattr(Leadership, "leading", property(lambda self: False))
                assert plane.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9105",)
                route = plane.routes.route("http://127.0.0.1:9105")
                assert route is not None and (route.node_id, route.secret) == ("n1", "x")
            finally:
                leading.cancel()
                await asyncio.gather(leading, return_exceptions=True)


def test_a_table_published_before_engines_were_named_still_reads() -> None:
    old = '{"ready":{"m":[{"endpoint":"http://e","node_id":"n","secret":"k","shard_id":"s"}]},"unreachable":[],"why":{}}'
    (replica,) = RoutingTable.from_text(old).ready["m"]
    assert replica.engine == ""


class TestTakeover:
    async def test_a_server_that_has_just_taken_the_lead_serves_the_last_table_before_settling_starts(
        self,
    ) -> None:
        """Between taking the lock and starting its takeover, the new leader's inventory is empty."""
        leadership = Leadership("postgresql://llmgw@127.0.0.1/none", "cp2", "127.0.0.1:7444")
        routes = FleetRoutes(Inventory(grace_s=5.0), leadership, Catalog(CFG), 5.0)
        replica = Published("http://127.0.0.1:9109", "n1", "s1", "k", "sglang")
        routes._apply(RoutingTable(ready={MODEL: [replica]}), 1)
        leadership._step_up()
        assert routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9109",)
        route = routes.route("http://127.0.0.1:9109")
        assert route is not None and route.secret == "k"
        # Which APIs its engine speaks itself goes with it: the gateway translates the others.
        assert route.native_apis == ENGINES["sglang"].native_apis
        assert routes.table().ready == {MODEL: [replica]}

    async def test_a_new_leader_routes_by_the_last_table_until_its_nodes_reconnect_and_only_then_places(
        self, postgres_url: str
    ) -> None:
        """A new leader knows no replica until its agents reconnect: no request may fail meanwhile."""
        first, second = Plane(postgres_url, "cp1"), Plane(postgres_url, "cp2")
        async with contextlib.AsyncExitStack() as first_running:
            await first_running.enter_async_context(running(first))
            await eventually(lambda: first.settled.is_set(), ELECTED_S)
            async with running(second):
                await eventually(lambda: second.routes.generation > 0, ELECTED_S)
                first.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9106, "k")]))
                await eventually(lambda: second.routes.ready_endpoints(MODEL), ELECTED_S)
                # cp1 stops: cp2 takes over, knowing no node yet.
                await first_running.aclose()
                await eventually(lambda: second.leadership.leading, ELECTED_S)
                assert not second.inventory.nodes()
                assert second.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9106",)
                route = second.routes.route("http://127.0.0.1:9106")
                assert route is not None and route.secret == "k"
                assert not second.settled.is_set(), "nothing is placed before n1 has reconnected"
                # What it publishes meanwhile keeps n1's replica, for any other standby.
                assert second.routes.table().ready[MODEL][0].shard_id == "s1"

                second.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9106, "k")]))
                await eventually(lambda: second.settled.is_set(), ELECTED_S)
                assert second.routes.ready_endpoints(MODEL) == ("http://127.0.0.1:9106",)
                route = second.routes.route("http://127.0.0.1:9106")
                assert route is not None and route.secret == "k"

    async def test_a_new_leader_whose_nodes_never_come_back_places_after_the_grace(
        self, postgres_url: str
    ) -> None:
        first, second = Plane(postgres_url, "cp1"), Plane(postgres_url, "cp2", grace_s=0.5)
        async with contextlib.AsyncExitStack() as first_running:
            await first_running.enter_async_context(running(first))
            await eventually(lambda: first.settled.is_set(), ELECTED_S)
            async with running(second):
                first.inventory.attach(pb.Register(node_id="n1", running=[ready("n1", "s1", 9107, "k")]))
                await eventually(lambda: second.routes.ready_endpoints(MODEL), ELECTED_S)
                await first_running.aclose()
                await eventually(lambda: second.leadership.leading, ELECTED_S)
                await eventually(lambda: second.settled.is_set(), ELECTED_S)
                assert second.routes.ready_endpoints(MODEL) == ()
