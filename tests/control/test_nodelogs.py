"""Log requests down a node's real stream (agent service and agent client over mutual TLS on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from llmgw.agent.client import AgentClient
from llmgw.config import AgentConfig, ServerConfig
from llmgw.control.inventory import Inventory, NodeNotConnected
from llmgw.control.nodelogs import LogRequests, NoAnswer
from llmgw.control.stream.service import serve_agents
from llmgw.log import LogRing
from llmgw.proto.llmgw import v1 as pb

Fleet = Any


class Engines:
    """A supervisor that runs nothing but has output to show, as the real one keeps it."""

    def __init__(self, outputs: dict[str, list[str]]) -> None:
        self.on_status: Callable[[pb.ShardStatus], None] | None = None
        self._outputs = outputs

    def advertise(self, address: str) -> None:
        pass

    async def start(self, req: pb.StartShard) -> None:
        raise AssertionError("nothing is started here")

    async def stop(self, shard_id: str) -> None:
        raise AssertionError("nothing is stopped here")

    def statuses(self) -> list[pb.ShardStatus]:
        return [
            pb.ShardStatus(shard_id=s, model="sim-chat", engine="sim", state="ready") for s in self._outputs
        ]

    def output(self, shard_id: str) -> list[str]:
        return list(self._outputs.get(shard_id, []))

    def sources(self) -> list[str]:
        return list(self._outputs)


def ring_of(*lines: str) -> LogRing:
    ring = LogRing(capacity=50)
    for line in lines:
        ring.append(line)
    return ring


@asynccontextmanager
async def node(
    fleet: Fleet, port: int, node_id: str, ring: LogRing, engines: Engines
) -> AsyncIterator[AgentClient]:
    cfg = AgentConfig(
        node_id=node_id, servers=[f"127.0.0.1:{port}"], tls=fleet.agents[node_id], heartbeat_interval_s=0.05
    )
    client = AgentClient(cfg, engines, {"sim": "1"}, backoff_base_s=0.02, backoff_max_s=0.1, ring=ring)
    task = asyncio.create_task(client.run())
    try:
        await asyncio.wait_for(client.connected.wait(), 5)
        yield client
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


class TestOverARealStream:
    async def test_a_log_request_goes_down_the_stream_and_its_reply_comes_back_to_its_waiter(
        self, fleet: Fleet, server_cfg: ServerConfig
    ):
        inventory = Inventory(5.0)
        engines = Engines({"sim-chat-1": ["engine line 1", "engine line 2"]})
        async with (
            serve_agents(server_cfg, inventory) as port,
            node(fleet, port, "n1", ring_of("agent line 1", "agent line 2", "agent line 3"), engines),
        ):
            log = await inventory.logs.fetch("n1", "agent", 2)
        assert log.lines == ["agent line 2", "agent line 3"]
        assert log.sources == ["agent", "sim-chat-1"]
        assert log.error == ""

    async def test_several_requests_in_flight_at_once_each_get_their_own_reply(
        self, fleet: Fleet, server_cfg: ServerConfig
    ):
        inventory = Inventory(5.0)
        async with (
            serve_agents(server_cfg, inventory) as port,
            node(fleet, port, "n1", ring_of("n1 agent"), Engines({"s1": ["s1 out"], "s2": ["s2 out"]})),
            node(fleet, port, "n2", ring_of("n2 agent"), Engines({})),
        ):
            asked = [("n1", "agent"), ("n1", "s1"), ("n1", "s2"), ("n2", "agent"), ("n1", "s1")] * 4
            logs = await asyncio.gather(*(inventory.logs.fetch(n, s, 10) for n, s in asked))
            assert inventory.logs.pending() == 0
        expected = {
            ("n1", "agent"): ["n1 agent"],
            ("n1", "s1"): ["s1 out"],
            ("n1", "s2"): ["s2 out"],
            ("n2", "agent"): ["n2 agent"],
        }
        assert [log.lines for log in logs] == [expected[a] for a in asked]
        assert [(log.node, log.source) for log in logs] == asked

    async def test_an_unknown_source_is_answered_with_the_nodes_sources(
        self, fleet: Fleet, server_cfg: ServerConfig
    ):
        inventory = Inventory(5.0)
        async with (
            serve_agents(server_cfg, inventory) as port,
            node(fleet, port, "n1", ring_of(), Engines({"s1": []})),
        ):
            log = await inventory.logs.fetch("n1", "gone-7", 10)
        assert log.error == "no engine gone-7 runs on this node"
        assert log.sources == ["agent", "s1"]

    async def test_a_node_without_a_stream_is_refused_at_once(self):
        inventory = Inventory(5.0)
        with pytest.raises(NodeNotConnected, match="node n9 is not connected"):
            await inventory.logs.fetch("n9", "agent", 10)
        assert inventory.logs.pending() == 0


class TestWaiting:
    def silent_inventory(self) -> Inventory:
        inventory = Inventory(5.0)
        # A node whose stream is open but whose agent never answers (one older than LogsRequest).
        inventory.attach(pb.Register(node_id="n1"))
        return inventory

    async def test_a_node_that_does_not_answer_in_time_is_said_not_to_have_answered(self):
        inventory = self.silent_inventory()
        inventory.logs = LogRequests(inventory.send, timeout_s=0.05)
        with pytest.raises(NoAnswer, match=r"^node n1 did not answer within 0.05 s$"):
            await inventory.logs.fetch("n1", "agent", 10)
        assert inventory.logs.pending() == 0

    def test_the_default_wait_is_ten_seconds(self):
        assert Inventory(5.0).logs.timeout_s == 10.0

    async def test_a_reply_from_another_node_is_not_taken_for_the_answer(self):
        inventory = self.silent_inventory()
        inventory.attach(pb.Register(node_id="n2"))
        fetching = asyncio.create_task(inventory.logs.fetch("n1", "agent", 10, timeout_s=5))
        await asyncio.sleep(0)
        request_id = "logs-1"
        inventory.logs.resolve("n2", pb.LogsReply(request_id=request_id, lines=["forged"]))
        assert not fetching.done()
        inventory.logs.resolve("n1", pb.LogsReply(request_id=request_id, lines=["real"], sources=["agent"]))
        assert (await fetching).lines == ["real"]

    async def test_a_late_reply_after_the_waiter_gave_up_is_dropped(self):
        inventory = self.silent_inventory()
        with pytest.raises(NoAnswer):
            await inventory.logs.fetch("n1", "agent", 10, timeout_s=0.01)
        inventory.logs.resolve("n1", pb.LogsReply(request_id="logs-1", lines=["late"]))
        assert inventory.logs.pending() == 0
