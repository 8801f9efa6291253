"""Refused agent connections: logged on the server with the client's address and why, counted, listed."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import pytest
from grpclib.exceptions import GRPCError, StreamTerminatedError
from structlog.testing import capture_logs

from llmgw.adminapi import projections
from llmgw.adminapi.present import refused_line
from llmgw.catalog import Catalog
from llmgw.control.inventory import Inventory
from llmgw.control.stream.handshake import EVENT
from llmgw.control.stream.refusals import Refusals, Refused
from llmgw.control.stream.service import serve_agents

from .stream.test_service import dial, register

NOT_OURS = "certificate not signed by this control plane's authority"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _refused_at_tls(port: int, tls) -> None:
    with pytest.raises(StreamTerminatedError):
        async with dial(port, tls) as stream:
            await stream.send_message(register("n1"))
            await stream.recv_message()


async def test_an_agent_with_another_authoritys_certificate_is_logged_counted_and_listed(
    server_cfg, fleet, eventually
):
    inventory = Inventory(server_cfg.control.grace_s)
    with capture_logs() as logs:
        async with serve_agents(server_cfg, inventory) as port:
            for _ in range(3):
                await _refused_at_tls(port, fleet.stranger)
            await eventually(lambda: sum(r.count for r in inventory.refused.recent()) == 3)
    [refused] = inventory.refused.recent()
    assert (refused.peer, refused.reason, refused.count) == ("127.0.0.1", NOT_OURS, 3)
    logged = [e for e in logs if e["event"] == EVENT]
    assert len(logged) == 3 and all(e["peer"].startswith("127.0.0.1:") for e in logged)
    [status] = projections.status_view(inventory, Catalog(server_cfg).models()).refused
    assert refused_line(status) == f"3 refused connections from 127.0.0.1 in the last hour: {NOT_OURS}"
    assert inventory.nodes() == []


async def test_an_agent_with_no_certificate_is_counted_as_presenting_none(server_cfg, fleet, eventually):
    inventory = Inventory(server_cfg.control.grace_s)
    bare = await asyncio.to_thread(ssl.create_default_context, cafile=fleet.server.ca)
    with capture_logs():
        async with serve_agents(server_cfg, inventory) as port:
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=bare, server_hostname="localhost"
                )
                writer.close()
                await writer.wait_closed()
            await eventually(lambda: inventory.refused.recent())
    [refused] = inventory.refused.recent()
    assert (refused.peer, refused.reason, refused.count) == ("127.0.0.1", "no certificate presented", 1)


async def test_a_node_registering_as_another_is_logged_with_its_address_and_counted(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    with capture_logs() as logs:
        async with serve_agents(server_cfg, inventory) as port:
            with pytest.raises(GRPCError):
                async with dial(port, fleet.agents["n1"]) as stream:
                    await stream.send_message(register("n2"))
                    await stream.recv_message()
    [refused] = inventory.refused.recent()
    assert (refused.peer, refused.reason) == ("127.0.0.1", "certificate for n1 used to register as n2")
    [logged] = [e for e in logs if e["event"] == "refused a node registering as another"]
    assert logged["peer"].startswith("127.0.0.1:")


async def test_an_agent_that_connects_is_not_counted(server_cfg, fleet):
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port, dial(port, fleet.agents["n1"]) as stream:
        await stream.send_message(register("n1"))
        assert (await stream.recv_message()) is not None
    assert inventory.refused.recent() == []


class TestTheLastHour:
    def test_refusals_are_grouped_by_address_and_reason_the_newest_first(self):
        clock = Clock()
        refusals = Refusals(clock)
        refusals.refuse("198.18.0.7:40001", NOT_OURS)
        refusals.refuse("198.18.0.7:40002", NOT_OURS)
        refusals.refuse("[fd00::7]:40003", "no certificate presented")
        clock.now += 10
        refusals.refuse("198.18.0.7:40004", NOT_OURS)
        assert refusals.recent() == [
            Refused(peer="198.18.0.7", reason=NOT_OURS, count=3, last_s=0.0),
            Refused(peer="fd00::7", reason="no certificate presented", count=1, last_s=10.0),
        ]

    def test_a_refusal_older_than_an_hour_is_no_longer_counted(self):
        clock = Clock()
        refusals = Refusals(clock)
        refusals.refuse("198.18.0.7:40001", NOT_OURS)
        clock.now += 3000
        refusals.refuse("198.18.0.7:40002", NOT_OURS)
        clock.now += 601
        assert [(r.count, r.last_s) for r in refusals.recent()] == [(1, 601.0)]
        clock.now += 3600
        assert refusals.recent() == []

    def test_one_refusal_reads_in_the_singular(self):
        one = Refused(peer="198.18.0.7", reason=NOT_OURS, count=1, last_s=0.0)
        assert refused_line(one) == f"1 refused connection from 198.18.0.7 in the last hour: {NOT_OURS}"
