"""On-demand models: a cold model's requests held while one replica starts, idle replicas stopped,
replicas that follow the load, and idle replicas of other models stopped to make room.

The gateway's stage (gateway/coldstart.py), the leader's reconciler and its scaler
(control/scaling.py) against a real inventory, with an injected wall clock: no test waits on time.
"""

from __future__ import annotations

import asyncio

import betterproto
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ModelConfig, ProfileConfig, ScaleConfig, ServerConfig, TimeoutsConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.reconciler import Reconciler
from llmgw.control.scaling import Scaler
from llmgw.gateway.coldstart import ColdStarts
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store, open_store
from llmgw.store.scale import note_requests, read_scales


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def on_demand(name: str = "tiny-chat", gpus: int = 0, **scale: float) -> ModelConfig:
    profile = ProfileConfig(engine="sim", gpus_per_node=gpus)
    return ModelConfig(
        name=name,
        profiles=[profile],
        scale=ScaleConfig(**scale),  # type: ignore[arg-type]
        timeouts=TimeoutsConfig(cold_start_s=30),
    )


def node(inventory: Inventory, node_id: str = "n1", gpus: int = 0) -> Link:
    cards = [pb.Gpu(index=i, gpu_class="L4", healthy=True) for i in range(gpus)]
    return inventory.attach(
        pb.Register(node_id=node_id, engine_versions={"sim": "1"}, engines_probed=True, gpus=cards)
    )


def sent(link: Link) -> list[tuple[str, object]]:
    out = []
    while not link.outbox.empty():
        out.append(betterproto.which_one_of(link.outbox.get_nowait(), "kind"))
    return out


def status(
    shard: str, model: str, state: str, detail: str = "", gpus: tuple[int, ...] = ()
) -> pb.ShardStatus:
    endpoint = f"http://127.0.0.1:9{abs(hash(shard)) % 1000:03d}" if state == "ready" else ""
    return pb.ShardStatus(
        shard_id=shard,
        model=model,
        engine="sim",
        state=state,
        endpoint=endpoint,
        detail=detail,
        gpu_indices=list(gpus),
    )


class Fleet:
    """One server's catalog, inventory, reconciler and gateway stage, on a clock the test moves."""

    def __init__(
        self, *models: ModelConfig, in_flight: dict[str, int] | None = None, store: Store | None = None
    ) -> None:
        self.clock = Clock()
        self.cfg = ServerConfig(models=list(models), control=ControlConfig(base_backoff_s=60))
        self.catalog = Catalog(self.cfg)
        self.inventory = Inventory(grace_s=15)
        self.in_flight = in_flight if in_flight is not None else {}
        self.cold = ColdStarts(self.catalog, self.inventory, clock=self.clock, recheck_s=0.01)
        self.scaler = Scaler(self.in_flight, self.cold, clock=self.clock, store=store)
        self.reconciler = Reconciler(
            self.cfg, self.inventory, self.catalog, in_flight=self.in_flight, scaler=self.scaler
        )
        self.served: list[str] = []

    async def request(self, model: str) -> web.StreamResponse:
        call = Call(make_mocked_request("POST", "/v1/chat/completions"), model=model)

        async def rest(call: Call) -> web.StreamResponse:
            self.served.append(call.model)
            return web.Response(text="ok")

        return await self.cold(call, rest)

    async def held(self, model: str, count: int = 1) -> None:
        # The held requests' tasks run as this one yields: a few turns of the loop, no clock.
        for _ in range(100):
            if self.cold.held(model) >= count:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"{count} request(s) for {model} were never held")


def starts(link: Link) -> list[pb.StartShard]:
    return [m for kind, m in sent(link) if kind == "start"]  # type: ignore[misc]


class TestColdStart:
    async def test_a_request_for_a_cold_model_is_held_while_one_replica_starts_and_is_then_served(self):
        fleet = Fleet(on_demand(min=0, max=1))
        link = node(fleet.inventory)
        await fleet.reconciler.reconcile()
        assert sent(link) == []  # min 0: nothing runs before a request
        first = asyncio.create_task(fleet.request("tiny-chat"))
        second = asyncio.create_task(fleet.request("tiny-chat"))
        await fleet.held("tiny-chat", 2)
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        await fleet.reconciler.reconcile()
        assert starts(link) == []  # the two held requests share that one start
        assert not first.done()
        fleet.clock.now += 2
        fleet.inventory.shard_status("n1", status(start.shard_id, "tiny-chat", "ready"))
        await fleet.reconciler.reconcile()
        assert (await first).status == 200 and (await second).status == 200
        assert fleet.served == ["tiny-chat", "tiny-chat"]
        state = fleet.scaler.state("tiny-chat")
        assert state is not None and state.replicas == 1
        assert state.reason == "a request came for tiny-chat, which had no replica running"
        assert state.cold_start is not None and state.cold_start.node == "n1"

    async def test_a_start_that_fails_gives_the_held_request_a_503_with_the_engines_own_words(self):
        fleet = Fleet(on_demand(min=0, max=1))
        link = node(fleet.inventory)
        held = asyncio.create_task(fleet.request("tiny-chat"))
        await fleet.held("tiny-chat")
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        words = "sim exited with code 1: error: failed to load model 'tiny.gguf'"
        fleet.inventory.shard_status("n1", status(start.shard_id, "tiny-chat", "failed", words))
        await fleet.reconciler.reconcile()
        with pytest.raises(ApiError) as refused:
            await held
        assert refused.value.status == 503
        assert refused.value.message == f"tiny-chat could not be started: {words}"

    async def test_a_request_held_past_cold_start_s_gets_a_503_saying_where_the_start_stands(self):
        model = ModelConfig(
            name="tiny-chat",
            profiles=[ProfileConfig(engine="sim")],
            scale=ScaleConfig(min=0, max=1),
            timeouts=TimeoutsConfig(cold_start_s=0.05),
        )
        fleet = Fleet(model)
        link = node(fleet.inventory)
        held = asyncio.create_task(fleet.request("tiny-chat"))
        await fleet.held("tiny-chat")
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        fleet.inventory.shard_status(
            "n1", status(start.shard_id, "tiny-chat", "downloading", "downloading tiny.gguf: 40 of 120 MB")
        )
        with pytest.raises(ApiError) as refused:
            await held
        assert refused.value.status == 503
        assert refused.value.headers == {"Retry-After": "30"}
        assert refused.value.message == (
            "tiny-chat is starting (downloading weights on n1: tiny.gguf: 40 of 120 MB); this request waited "
            "0.05 s (timeouts.cold_start_s): retry in about 30 s"
        )

    async def test_a_model_with_fixed_replicas_and_none_ready_is_refused_at_once_as_before(self):
        fleet = Fleet(ModelConfig(name="fixed", profiles=[ProfileConfig(engine="sim")]))
        response = await fleet.request("fixed")
        assert response.status == 200 and fleet.cold.waiting() == {}


async def ready_replica(fleet: Fleet, link: Link, model: str, gpus: tuple[int, ...] = ()) -> str:
    """Place one replica of model by a held request, and make it ready: its endpoint."""
    task = asyncio.create_task(fleet.request(model))
    await fleet.held(model)
    await fleet.reconciler.reconcile()
    (start,) = starts(link)
    ready = status(start.shard_id, model, "ready", gpus=gpus)
    ready.profile = start.profile
    fleet.inventory.shard_status(link.node_id, ready)
    await fleet.reconciler.reconcile()
    await task
    (endpoint,) = fleet.inventory.ready_endpoints(model)
    return endpoint


class TestIdle:
    async def test_a_replica_above_min_is_stopped_after_idle_s_without_a_request(self):
        fleet = Fleet(on_demand(min=0, max=1, idle_s=300))
        link = node(fleet.inventory)
        await ready_replica(fleet, link, "tiny-chat")
        fleet.clock.now += 299
        await fleet.reconciler.reconcile()
        assert sent(link) == []
        fleet.clock.now += 1
        await fleet.reconciler.reconcile()
        ((kind, stop),) = sent(link)
        assert kind == "stop"
        assert stop.reason == "no request for 300 s (scale.idle_s 300)"  # type: ignore[attr-defined]
        assert fleet.inventory.replicas("tiny-chat") == []

    async def test_a_model_is_never_brought_below_its_min_by_idleness(self):
        fleet = Fleet(on_demand(min=1, max=2, idle_s=10))
        link = node(fleet.inventory)
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        fleet.inventory.shard_status("n1", status(start.shard_id, "tiny-chat", "ready"))
        fleet.clock.now += 3600
        await fleet.reconciler.reconcile()
        assert sent(link) == []


class TestLoad:
    async def test_a_replica_is_added_when_the_load_stays_above_the_target_and_removed_when_it_falls(self):
        in_flight: dict[str, int] = {}
        fleet = Fleet(
            on_demand(min=1, max=3, target_in_flight=8, window_s=60, idle_s=3600), in_flight=in_flight
        )
        link = node(fleet.inventory)
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        fleet.inventory.shard_status("n1", status(start.shard_id, "tiny-chat", "ready"))
        (first,) = fleet.inventory.ready_endpoints("tiny-chat")
        in_flight[first] = 14
        await fleet.reconciler.reconcile()
        fleet.clock.now += 59
        await fleet.reconciler.reconcile()
        assert starts(link) == []
        fleet.clock.now += 1
        await fleet.reconciler.reconcile()
        (second,) = starts(link)
        state = fleet.scaler.state("tiny-chat")
        assert state is not None
        assert state.reason == "2 replicas: 14.0 in flight per replica for 60 s, target 8"
        fleet.inventory.shard_status("n1", status(second.shard_id, "tiny-chat", "ready"))
        in_flight[first] = 3
        await fleet.reconciler.reconcile()
        fleet.clock.now += 60
        await fleet.reconciler.reconcile()
        ((kind, stop),) = sent(link)
        # The idle one goes; the one serving three requests stays.
        assert kind == "stop" and stop.shard_id == second.shard_id  # type: ignore[attr-defined]
        assert state.replicas == 1
        assert state.reason.startswith("1 replicas: 1.5 in flight per replica for 60 s, target 8")


class TestEviction:
    async def test_an_idle_replica_of_another_on_demand_model_makes_room_on_a_node_that_holds_one(self):
        fleet = Fleet(
            on_demand("chat-a", gpus=1, min=0, max=1, idle_s=3600),
            on_demand("chat-b", gpus=1, min=0, max=1, idle_s=3600),
        )
        link = node(fleet.inventory, gpus=1)
        await ready_replica(fleet, link, "chat-a", gpus=(0,))
        fleet.clock.now += 100
        held = asyncio.create_task(fleet.request("chat-b"))
        await fleet.held("chat-b")
        await fleet.reconciler.reconcile()
        ((kind, stop),) = sent(link)
        words = "stopped an idle replica of chat-a on n1 (last used 100 s ago) to make room for chat-b"
        assert kind == "stop" and stop.reason == words  # type: ignore[attr-defined]
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        assert start.model == "chat-b"
        fleet.inventory.shard_status("n1", status(start.shard_id, "chat-b", "ready", gpus=(0,)))
        await fleet.reconciler.reconcile()
        assert (await held).status == 200
        a, b = fleet.scaler.state("chat-a"), fleet.scaler.state("chat-b")
        assert a is not None and b is not None
        assert (a.replicas, a.eviction, b.eviction) == (0, words, words)

    async def test_a_replica_serving_requests_is_never_stopped_to_make_room(self):
        in_flight: dict[str, int] = {}
        fleet = Fleet(
            on_demand("chat-a", gpus=1, min=0, max=1, idle_s=3600),
            on_demand("chat-b", gpus=1, min=0, max=1, idle_s=3600),
            in_flight=in_flight,
        )
        link = node(fleet.inventory, gpus=1)
        endpoint = await ready_replica(fleet, link, "chat-a", gpus=(0,))
        in_flight[endpoint] = 1
        held = asyncio.create_task(fleet.request("chat-b"))
        await fleet.held("chat-b")
        await fleet.reconciler.reconcile()
        assert sent(link) == []
        held.cancel()

    async def test_an_idle_replica_of_a_higher_priority_model_is_not_stopped_for_a_lower_one(self):
        fleet = Fleet(
            on_demand("chat-a", gpus=1, min=0, max=1, idle_s=3600, priority=5),
            on_demand("chat-b", gpus=1, min=0, max=1, idle_s=3600, priority=1),
        )
        link = node(fleet.inventory, gpus=1)
        await ready_replica(fleet, link, "chat-a", gpus=(0,))
        held = asyncio.create_task(fleet.request("chat-b"))
        await fleet.held("chat-b")
        await fleet.reconciler.reconcile()
        assert sent(link) == []
        held.cancel()


class TestStored:
    async def test_a_new_leader_keeps_the_replica_a_held_request_started_on_the_last_one(self, tmp_path):
        async with open_store(tmp_path / "llmgw.db") as store:
            fleet = Fleet(on_demand(min=0, max=1, idle_s=600), store=store)
            link = node(fleet.inventory)
            await ready_replica(fleet, link, "tiny-chat")
            (replica,) = fleet.inventory.replicas("tiny-chat")
            # The server restarts (or another takes over): the agent reports the engine it kept running.
            after = Fleet(on_demand(min=0, max=1, idle_s=600), store=store)
            after.clock.now = fleet.clock.now + 30
            again = after.inventory.attach(
                pb.Register(
                    node_id="n1",
                    engine_versions={"sim": "1"},
                    engines_probed=True,
                    running=[status(replica.shard_id, "tiny-chat", "ready")],
                )
            )
            await after.scaler.load()
            await after.reconciler.reconcile()
            assert sent(again) == []  # not stopped as if nothing had asked for it
            state = after.scaler.state("tiny-chat")
            assert state is not None and state.replicas == 1
            assert (
                state.cold_start is not None and after.cold.expected["tiny-chat"] == state.cold_start.total_s
            )
            # Its idle timer goes on from the last request the first one saw, not from the takeover.
            after.clock.now = fleet.clock.now + 600
            await after.reconciler.reconcile()
            assert [kind for kind, _ in sent(again)] == ["stop"]

    async def test_a_request_held_by_another_servers_gateway_starts_a_replica_on_the_leader(self, tmp_path):
        async with open_store(tmp_path / "llmgw.db") as store:
            leader = Fleet(on_demand(min=0, max=1), store=store)
            link = node(leader.inventory)
            standby = Fleet(on_demand(min=0, max=1))
            standby.clock.now = leader.clock.now
            held = asyncio.create_task(standby.request("tiny-chat"))
            await standby.held("tiny-chat")
            reports = asyncio.create_task(standby.cold.keep_reporting(store, interval_s=3600))
            try:
                for _ in range(200):
                    rows = await read_scales(store)
                    if rows and rows[0].wanted_at:
                        break
                    await asyncio.sleep(0.01)
            finally:
                reports.cancel()
            leader.clock.now += 1
            await leader.reconciler.reconcile()  # reads the store: a request is held for it
            await leader.reconciler.reconcile()
            (start,) = starts(link)
            assert start.model == "tiny-chat"
            held.cancel()

    async def test_a_request_another_gateway_held_does_not_keep_a_ready_replica_from_idling(self, tmp_path):
        async with open_store(tmp_path / "llmgw.db") as store:
            # Idle sooner than the cold start's bound (30 s).
            fleet = Fleet(on_demand(min=0, max=1, idle_s=10), store=store)
            link = node(fleet.inventory)
            await ready_replica(fleet, link, "tiny-chat")
            # A standby held one too, at the same moment, and wrote so; the replica served it.
            await note_requests(store, {"tiny-chat": fleet.clock.now}, {"tiny-chat": fleet.clock.now})
            fleet.clock.now += 1
            await fleet.reconciler.reconcile()  # reads the store
            fleet.clock.now += 10
            await fleet.reconciler.reconcile()
            assert [kind for kind, _ in sent(link)] == ["stop"]
            # Nor is it started again by that request, long served, once none is ready.
            await fleet.reconciler.reconcile()
            assert sent(link) == []

    async def test_on_a_node_without_gpus_the_memory_a_model_needs_is_made_room_for(self):
        profile = ProfileConfig(engine="sim", min_memory_mb=6000)
        models = [
            ModelConfig(name=n, profiles=[profile], scale=ScaleConfig(min=0, max=1, idle_s=3600))
            for n in ("chat-a", "chat-c", "chat-b")
        ]
        fleet = Fleet(*models)
        link = fleet.inventory.attach(
            pb.Register(
                node_id="n1",
                engine_versions={"sim": "1"},
                engines_probed=True,
                memory=pb.Memory(total_mb=16000, available_mb=16000),
            )
        )
        await ready_replica(fleet, link, "chat-a")
        fleet.clock.now += 10
        await ready_replica(fleet, link, "chat-c")
        held = asyncio.create_task(fleet.request("chat-b"))
        await fleet.held("chat-b")
        await fleet.reconciler.reconcile()
        ((kind, stop),) = sent(link)
        # chat-a was used longest ago.
        said = stop.reason  # type: ignore[attr-defined]
        assert kind == "stop" and said.startswith("stopped an idle replica of chat-a on n1")
        await fleet.reconciler.reconcile()
        (start,) = starts(link)
        assert start.model == "chat-b"
        held.cancel()

    async def test_a_takeover_in_the_middle_of_a_start_does_not_start_a_second_replica(self, tmp_path):
        async with open_store(tmp_path / "llmgw.db") as store:
            fleet = Fleet(on_demand(min=0, max=1), store=store)
            link = node(fleet.inventory)
            held = asyncio.create_task(fleet.request("tiny-chat"))
            await fleet.held("tiny-chat")
            await fleet.reconciler.reconcile()
            (start,) = starts(link)
            held.cancel()
            # The leader goes away while the node fetches the weights; another takes over.
            after = Fleet(on_demand(min=0, max=1), store=store)
            after.clock.now = fleet.clock.now + 5
            again = after.inventory.attach(
                pb.Register(
                    node_id="n1",
                    engine_versions={"sim": "1"},
                    engines_probed=True,
                    running=[status(start.shard_id, "tiny-chat", "downloading", "downloading tiny.gguf")],
                )
            )
            await after.scaler.load()
            await after.reconciler.reconcile()
            assert sent(again) == []
            state = after.scaler.state("tiny-chat")
            assert state is not None and state.replicas == 1
