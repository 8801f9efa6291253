"""Across hosts, the control side: each replica's secret, the address rank 0 is reached at, a node lost.

A node lost is its agent silent past the grace: its engines stay routed until
one fails the gateway, and only then are its requests in flight abandoned.

The inventory and the reconciler on a fake clock; nothing listens (the gateway
side of the same is tests/gateway/test_engine_routes.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import betterproto
import pytest

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import READY, UNREACHABLE, Inventory, Link
from llmgw.control.reconciler import Reconciler
from llmgw.engines.sim import SimEngine
from llmgw.proto.llmgw import v1 as pb

SECRET = "s3cret-of-replica-one"
ENDPOINT = "http://10.0.0.21:20001"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ready(shard_id: str = "s1", endpoint: str = ENDPOINT, secret: str = SECRET) -> pb.ShardStatus:
    return pb.ShardStatus(
        shard_id=shard_id,
        model="sim-chat",
        engine="sim",
        state=READY,
        endpoint=endpoint,
        engine_secret=secret,
    )


def register(node_id: str, *running: pb.ShardStatus, **kw: object) -> pb.Register:
    return pb.Register(
        node_id=node_id,
        engine_versions={"sim": "1"},
        engines_probed=True,
        running=list(running),
        **kw,  # type: ignore[arg-type]
    )


def starts(link: Link) -> list[pb.StartShard]:
    out = []
    while not link.outbox.empty():
        kind, value = betterproto.which_one_of(link.outbox.get_nowait(), "kind")
        if kind == "start":
            out.append(value)
    return out


def catalog(*models: ModelConfig) -> ServerConfig:
    return ServerConfig(models=list(models), control=ControlConfig(base_backoff_s=60.0))


def _reconciler(cfg: ServerConfig, inventory: Inventory, **kwargs: Any) -> Reconciler:
    return Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, **kwargs)


class TestSecrets:
    async def test_each_replica_is_started_with_a_secret_of_its_own(self) -> None:
        inventory = Inventory(grace_s=15)
        link = inventory.attach(register("n1"))
        model = ModelConfig(name="sim-chat", replicas=2, profiles=[ProfileConfig(engine="sim")])
        await _reconciler(catalog(model), inventory).reconcile()
        secrets = [s.engine_secret for s in starts(link)]
        assert len(secrets) == 2 and all(len(s) >= 32 for s in secrets)
        assert secrets[0] != secrets[1]

    async def test_the_gateway_is_routed_to_a_ready_engine_with_the_secret_its_start_carried(self) -> None:
        inventory = Inventory(grace_s=15)
        link = inventory.attach(register("n1"))
        model = ModelConfig(name="sim-chat", profiles=[ProfileConfig(engine="sim")])
        await _reconciler(catalog(model), inventory).reconcile()
        (start,) = starts(link)
        # The agent's report says nothing of the secret (an older agent): the one sent is kept.
        inventory.shard_status("n1", ready(start.shard_id, secret=""))
        route = inventory.route(ENDPOINT)
        assert route is not None
        assert (route.node_id, route.shard_id, route.secret) == ("n1", start.shard_id, start.engine_secret)
        # And which APIs its engine speaks itself, for the gateway to translate the others.
        assert route.native_apis == SimEngine.native_apis

    async def test_a_restarted_control_plane_learns_the_secret_from_the_nodes_register(self) -> None:
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1", ready()))
        route = inventory.route(ENDPOINT)
        assert route is not None and route.secret == SECRET

    async def test_the_secret_is_on_no_replica_nor_node_and_not_in_a_routes_repr(self) -> None:
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1", ready()))
        (replica,) = inventory.replicas()
        node = inventory.node("n1")
        assert SECRET not in repr(attrs.asdict(replica))
        assert SECRET not in repr(node)
        assert SECRET not in repr(inventory.route(ENDPOINT))
        assert inventory.engine_secret("s1") == SECRET

    def test_a_replica_that_leaves_takes_its_secret_with_it(self) -> None:
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1", ready()))
        inventory.shard_status("n1", pb.ShardStatus(shard_id="s1", state="stopped"))
        assert inventory.engine_secret("s1") == ""


class TestNodeAddresses:
    def test_a_node_keeps_the_addresses_its_register_gives(self) -> None:
        inventory = Inventory(grace_s=15)
        inventory.attach(
            register("n1", advertise_address="10.0.0.21", fabric_address="192.168.50.21"), "10.0.0.21:51234"
        )
        node = inventory.node("n1")
        assert node is not None
        assert (node.advertise_address, node.fabric_address) == ("10.0.0.21", "192.168.50.21")

    @pytest.mark.parametrize("said", ["fabric", "advertised", "nothing"])
    async def test_rank_0_of_a_two_node_replica_is_reached_at_its_fabric_or_advertised_address(
        self, said: str
    ) -> None:
        """Its fabric address when it has one, else its advertised one; the peer only for an old agent."""
        addresses = {
            "n1": {"fabric": "192.168.50.21", "advertised": "10.0.0.21", "nothing": "172.16.0.21"},
            "n2": {"fabric": "192.168.50.22", "advertised": "10.0.0.22", "nothing": "172.16.0.22"},
        }
        inventory = Inventory(grace_s=15)
        gpus = [pb.Gpu(index=0, gpu_class="h100-80g", healthy=True, memory_total_mb=81920)]
        links = {
            node_id: inventory.attach(
                register(
                    node_id,
                    gpus=gpus,
                    fabrics=[pb.Fabric(name="ib-east")],
                    advertise_address=ours["advertised"] if said != "nothing" else "",
                    fabric_address=ours["fabric"] if said == "fabric" else "",
                ),
                f"{ours['nothing']}:40000",
            )
            for node_id, ours in addresses.items()
        }
        profile = ProfileConfig(engine="sim", gpu_class="h100-80g", gpus_per_node=1, nodes=2)
        await _reconciler(catalog(ModelConfig(name="big", profiles=[profile])), inventory).reconcile()
        sent = {node_id: starts(link) for node_id, link in links.items()}
        assert [len(s) for s in sent.values()] == [1, 1]
        (master,) = [node_id for node_id, ss in sent.items() if ss[0].rank == 0]
        every = [ss[0] for ss in sent.values()]
        assert {s.master_addr for s in every} == {addresses[master][said]}
        # One replica, one secret, whichever rank serves.
        assert len({s.engine_secret for s in every}) == 1


class TestLosingANode:
    async def test_a_node_declared_unreachable_keeps_its_engines_routed_and_their_requests_running(
        self,
    ) -> None:
        """Its agent's silence alone abandons nothing: the engine may serve on without it."""
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1", ready()))
        route = inventory.route(ENDPOINT)
        assert route is not None and not route.lost.done()
        clock.now += 15.5
        assert inventory.expire() == ["n1"]
        assert not route.lost.done()
        assert inventory.ready_endpoints("sim-chat") == (ENDPOINT,)
        (replica,) = inventory.replicas("sim-chat")
        assert [(r.shard_id, rt.secret) for r, rt in inventory.unattended()] == [("s1", SECRET)]
        clock.now += 24.5
        assert inventory.agent_unreachable_s(replica) == 40.0

    async def test_an_unattended_engine_that_fails_the_gateways_check_leaves_with_its_requests(
        self,
    ) -> None:
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1", ready()))
        route = inventory.route(ENDPOINT)
        assert route is not None
        clock.now += 16
        inventory.expire()
        inventory.engine_gone("s1", "sim on n1 did not answer the gateway's /health within 5 s")
        assert inventory.ready_endpoints("sim-chat") == ()
        assert inventory.unattended() == []
        assert route.lost.result() == (
            "it stopped answering the gateway while its node's agent is away: "
            "sim on n1 did not answer the gateway's /health within 5 s"
        )
        assert (
            inventory.why_no_ready("sim-chat")
            == "sim-chat has no ready replica: ready on n1, which is unreachable"
        )
        # Its agent back, reporting it ready: routed again.
        inventory.attach(register("n1", ready()))
        assert inventory.ready_endpoints("sim-chat") == (ENDPOINT,)

    async def test_while_its_agent_is_away_within_the_grace_a_nodes_engines_stay_routed(self) -> None:
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        link = inventory.attach(register("n1", ready()))
        # A clean agent restart, an upgrade: the stream ends, the engines serve on.
        inventory.detach(link)
        clock.now += 10
        assert inventory.expire() == []
        assert inventory.ready_endpoints("sim-chat") == (ENDPOINT,)
        clock.now += 6
        assert inventory.expire() == ["n1"]
        # Past it too, while the gateway's checks find it answering (control/engine_checks.py).
        assert inventory.ready_endpoints("sim-chat") == (ENDPOINT,)

    async def test_an_engine_that_refused_the_gateway_is_not_routed_until_its_agent_reports_it_ready(
        self,
    ) -> None:
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        link = inventory.attach(register("n1", ready()))
        inventory.detach(link)
        route = inventory.route(ENDPOINT)
        assert route is not None
        route.refused("connection refused")
        assert inventory.ready_endpoints("sim-chat") == ()
        # Its agent down, nobody says it is back: it stays out, however long.
        clock.now += 14
        inventory.expire()
        assert inventory.ready_endpoints("sim-chat") == ()
        # The agent comes back and reports it ready (its Register lists it).
        inventory.attach(register("n1", ready()))
        assert inventory.ready_endpoints("sim-chat") == (ENDPOINT,)

    async def test_on_a_node_whose_agent_is_connected_a_refused_engine_is_tried_again_after_the_grace(
        self,
    ) -> None:
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1", ready()))
        route = inventory.route(ENDPOINT)
        assert route is not None
        route.refused("connection refused")
        assert inventory.ready_endpoints("sim-chat") == ()
        for _ in range(3):
            clock.now += 5.1
            inventory.touch("n1")
            inventory.expire()
        assert inventory.ready_endpoints("sim-chat") == (ENDPOINT,)

    async def test_a_node_that_comes_back_after_its_replica_was_replaced_is_adopted_and_the_surplus_stopped(
        self,
    ) -> None:
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1", ready()))
        n2 = inventory.attach(register("n2"))
        model = ModelConfig(name="sim-chat", profiles=[ProfileConfig(engine="sim")])
        reconciler = _reconciler(catalog(model), inventory, clock=clock)
        clock.now += 16
        inventory.touch("n2")
        assert inventory.expire() == ["n1"]
        await reconciler.reconcile()
        (replacement,) = starts(n2)
        inventory.shard_status("n2", ready(replacement.shard_id, "http://10.0.0.22:20005", "other"))
        # n1 returns with its engine still running: adopted as it is, not started again.
        n1 = inventory.attach(register("n1", ready()))
        assert inventory.node("n1").state == READY  # type: ignore[union-attr]
        assert sorted(r.shard_id for r in inventory.replicas("sim-chat")) == sorted(
            ["s1", replacement.shard_id]
        )
        await reconciler.reconcile()
        # One replica is wanted: the reconciler's surplus rule stops one of the two, starts nothing.
        assert starts(n1) == [] and starts(n2) == []
        assert len(inventory.replicas("sim-chat")) == 1
        assert inventory.node("n1").state != UNREACHABLE  # type: ignore[union-attr]


async def test_the_lost_signal_is_made_afresh_once_the_node_returns() -> None:
    clock = Clock()
    inventory = Inventory(grace_s=15, clock=clock)
    inventory.attach(register("n1", ready()))
    first = inventory.route(ENDPOINT)
    clock.now += 16
    inventory.expire()
    inventory.engine_gone("s1", "no answer")
    inventory.attach(register("n1", ready()))
    again = inventory.route(ENDPOINT)
    assert first is not None and again is not None
    assert first.lost.done() and not again.lost.done()
    await asyncio.sleep(0)
