"""Several control planes on one real PostgreSQL: one leader by an advisory lock, standbys naming it.

The leader is elected through `pg_try_advisory_lock` on a dedicated connection: it goes with that
connection, whether the leader's process is killed or its connection is cut, and a standby takes it
at its next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from structlog.testing import capture_logs

from llmgw import config
from llmgw.agent.client import AgentClient
from llmgw.config import AgentConfig, ServerConfig
from llmgw.control.ha.leadership import Leadership, while_leading
from llmgw.control.inventory import Inventory
from llmgw.control.stream.service import free_port, serve_agents
from llmgw.stream_words import STANDBY

from ... import needs
from ...agent.test_client import FakeSupervisor
from ...postgres import Cluster
from ...waiting import eventually
from ..conftest import Fleet

pytestmark = pytest.mark.slow

POLL_S = 0.1
# How long an election may take here: a few polls, on a machine other tests load too.
ELECTED_S = 10.0


@contextlib.asynccontextmanager
async def plane(url: str, name: str, advertise: str, **options: float) -> AsyncIterator[Leadership]:
    async with Leadership(url, name, advertise, poll_s=POLL_S, **options) as leadership:
        yield leadership


def one_leader(*planes: Leadership) -> bool:
    return sum(p.leading for p in planes) == 1 and all(p.leader is not None for p in planes)


async def backend_pid(url: str, name: str) -> int:
    """The PostgreSQL session (its server process) that holds name's connection."""
    connection = await asyncpg.connect(url)
    try:
        pid = await connection.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", f"llmgw {name}"
        )
    finally:
        await connection.close()
    assert pid is not None, f"{name} has no session"
    return int(pid)


async def terminate(url: str, pid: int) -> None:
    connection = await asyncpg.connect(url)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


class TestElection:
    async def test_two_servers_on_one_database_elect_exactly_one_leader_and_the_standby_names_it(
        self, postgres_url: str
    ) -> None:
        async with (
            plane(postgres_url, "cp1", "198.18.0.1:7443") as first,
            plane(postgres_url, "cp2", "198.18.0.2:7443") as second,
        ):
            await eventually(lambda: one_leader(first, second), ELECTED_S)
            leader, standby = (first, second) if first.leading else (second, first)
            assert leader.refusal() is None
            assert standby.refusal() == f"{STANDBY}; the leader is {leader.name} at {leader.advertise}"
            # Still one after many polls: a standby never takes a lock that is held.
            for _ in range(5):
                await asyncio.sleep(POLL_S)
                assert one_leader(first, second)

    async def test_two_servers_given_the_same_name_are_told_so(self, postgres_url: str) -> None:
        with capture_logs() as logs:
            async with plane(postgres_url, "cp1", "198.18.0.1:7443") as first:
                await eventually(lambda: first.leading, ELECTED_S)
                async with plane(postgres_url, "cp1", "198.18.0.2:7443"):
                    await eventually(lambda: any(e["log_level"] == "error" for e in logs), ELECTED_S)
        (said,) = [e for e in logs if e["log_level"] == "error"]
        assert said["event"].startswith("another control plane sharing this database has the same name")
        assert (said["name"], said["other"]) == ("cp1", "198.18.0.1:7443")

    async def test_a_standby_takes_over_when_the_leaders_process_is_killed(self, postgres_url: str) -> None:
        """SIGKILL: the kernel closes the leader's socket, PostgreSQL releases its lock at once."""
        script = (
            "import asyncio, sys\n"
            "from llmgw.control.ha.leadership import Leadership\n"
            "async def main():\n"
            f"    async with Leadership({postgres_url!r}, 'cp1', '198.18.0.1:7443', poll_s={POLL_S}) as l:\n"
            "        await l.wait_leading()\n"
            "        print('leading', flush=True)\n"
            "        await asyncio.Event().wait()\n"
            "asyncio.run(main())\n"
        )
        leader = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, env={**os.environ}
        )
        try:
            assert leader.stdout is not None
            # Its own log goes to stdout as well: read up to the line the script prints.
            async with asyncio.timeout(60):
                while await leader.stdout.readline() != b"leading\n":
                    pass
            async with plane(postgres_url, "cp2", "198.18.0.2:7443") as standby:
                await eventually(lambda: standby.leader is not None, ELECTED_S)
                assert standby.refusal() == f"{STANDBY}; the leader is cp1 at 198.18.0.1:7443"
                killed = time.monotonic()
                leader.send_signal(signal.SIGKILL)
                await leader.wait()
                await eventually(lambda: standby.leading, ELECTED_S)
                took_s = time.monotonic() - killed
                await eventually(lambda: standby.leader is not None and standby.leader.name == "cp2")
                print(f"takeover after SIGKILL of the leader: {took_s:.2f} s (poll every {POLL_S} s)")
        finally:
            if leader.returncode is None:
                leader.send_signal(signal.SIGKILL)
                await leader.wait()

    async def test_a_leader_whose_connection_is_cut_steps_down_and_stops_its_leader_work(
        self, postgres_url: str
    ) -> None:
        started, cancelled = [], []

        async def work() -> None:
            started.append(1)
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.append(1)

        async with (
            plane(postgres_url, "cp1", "198.18.0.1:7443") as first,
            plane(postgres_url, "cp2", "198.18.0.2:7443") as second,
        ):
            watchers = [asyncio.create_task(while_leading(p, work)) for p in (first, second)]
            try:
                await eventually(lambda: one_leader(first, second), ELECTED_S)
                leader, standby = (first, second) if first.leading else (second, first)
                await eventually(lambda: started == [1])
                with capture_logs() as logs:
                    await terminate(postgres_url, await backend_pid(postgres_url, leader.name))
                    await eventually(lambda: standby.leading, ELECTED_S)
                    await eventually(lambda: cancelled == [1])
                assert not leader.leading
                assert any(e["event"] == "this control plane is no longer the leader" for e in logs)
                # The other's work runs now, and only it.
                await eventually(lambda: started == [1, 1])
                assert sum(p.leading for p in (first, second)) == 1
                # The old leader reconnects as a standby and names the new one.
                await eventually(lambda: leader.leader is not None and leader.leader.name == standby.name)
                assert leader.refusal() == f"{STANDBY}; the leader is {standby.name} at {standby.advertise}"
            finally:
                for watcher in watchers:
                    watcher.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)

    async def test_a_leader_that_postgresql_stops_answering_steps_down_on_its_own(
        self, postgres_url: str
    ) -> None:
        """A leader cut off from PostgreSQL must stop placing before its lock can pass to another."""
        needs.root("stopping PostgreSQL's server process")
        async with plane(postgres_url, "cp1", "198.18.0.1:7443", query_timeout_s=0.5) as leader:
            await eventually(lambda: leader.leading, ELECTED_S)
            pid = await backend_pid(postgres_url, "cp1")
            os.kill(pid, signal.SIGSTOP)
            try:
                await eventually(lambda: not leader.leading, ELECTED_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            # Once PostgreSQL answers again (the old session gone, the lock with it) it leads again.
            await eventually(lambda: leader.leading, ELECTED_S * 3)

    async def test_a_postgresql_that_cannot_be_reached_leaves_the_server_a_standby_saying_so(
        self, postgres: Cluster
    ) -> None:
        url = f"postgresql://llmgw@127.0.0.1:{_closed_port()}/nothing"
        with capture_logs() as logs:
            async with plane(url, "cp1", "198.18.0.1:7443") as alone:
                await eventually(
                    lambda: any("cannot reach PostgreSQL" in e["event"] for e in logs), ELECTED_S
                )
                assert not alone.leading
                assert alone.refusal() == (
                    f"{STANDBY}; no control plane holds the leadership right now "
                    "(one takes it within seconds)"
                )
        said = next(e for e in logs if "cannot reach PostgreSQL" in e["event"])
        assert said["database"] == url


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def agent_service(
    url: str, name: str, cfg: ServerConfig
) -> AsyncIterator[tuple[Leadership, Inventory, str, list[str]]]:
    """A control plane's election and agent service: (leadership, inventory, address, refusals)."""
    inventory = Inventory(grace_s=5.0)
    refusals: list[str] = []
    port = await asyncio.to_thread(free_port, "127.0.0.1")
    address = f"127.0.0.1:{port}"
    async with (
        Leadership(url, name, address, poll_s=POLL_S) as leadership,
        serve_agents(
            config.evolve(cfg, agent_listen=address), inventory, refused=refusals.append, gate=leadership
        ),
    ):
        yield leadership, inventory, address, refusals


def agent_of(fleet: Fleet, servers: list[str]) -> AgentClient:
    cfg = AgentConfig(node_id="n1", servers=servers, tls=fleet.agents["n1"], heartbeat_interval_s=0.1)
    return AgentClient(cfg, FakeSupervisor(), {"sim": "1"}, backoff_base_s=0.05, backoff_max_s=0.2)


class TestAgents:
    async def test_an_agent_listing_both_servers_connects_to_the_leader_whatever_the_order(
        self, postgres_url: str, fleet: Fleet, server_cfg: ServerConfig
    ) -> None:
        async with (
            agent_service(postgres_url, "cp1", server_cfg) as first,
            agent_service(postgres_url, "cp2", server_cfg) as second,
        ):
            await eventually(lambda: one_leader(first[0], second[0]), ELECTED_S)
            leader, standby = (first, second) if first[0].leading else (second, first)
            for servers in ([leader[2], standby[2]], [standby[2], leader[2]]):
                client = agent_of(fleet, servers)
                with capture_logs() as logs:
                    task = asyncio.create_task(client.run())
                    try:
                        await asyncio.wait_for(client.connected.wait(), ELECTED_S)
                        assert client.server == leader[2]
                        node = leader[1].node("n1")
                        assert node is not None and node.connected
                        assert standby[1].node("n1") is None
                    finally:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                turned_away = [e for e in logs if e["event"].startswith("a standby turned this node away")]
                if servers[0] == standby[2]:
                    assert [e["said"] for e in turned_away] == [
                        f"{STANDBY}; the leader is {leader[0].name} at {leader[2]}"
                    ]
                    assert standby[3] == ["standby"]
                    assert not [e for e in logs if e["event"] == "the control plane stream failed"]
                else:
                    assert not turned_away

    async def test_a_leader_that_loses_its_lock_lets_go_of_its_agents_and_they_find_the_new_leader(
        self, postgres_url: str, fleet: Fleet, server_cfg: ServerConfig
    ) -> None:
        async with (
            agent_service(postgres_url, "cp1", server_cfg) as first,
            agent_service(postgres_url, "cp2", server_cfg) as second,
        ):
            await eventually(lambda: one_leader(first[0], second[0]), ELECTED_S)
            leader, standby = (first, second) if first[0].leading else (second, first)
            client = agent_of(fleet, [leader[2], standby[2]])
            task = asyncio.create_task(client.run())
            try:
                await eventually(lambda: client.server == leader[2], ELECTED_S)
                await terminate(postgres_url, await backend_pid(postgres_url, leader[0].name))
                await eventually(lambda: standby[0].leading, ELECTED_S)
                await eventually(lambda: client.server == standby[2], ELECTED_S)
                node = standby[1].node("n1")
                assert node is not None and node.connected
                # The old leader let go of it: no two control planes hold one node.
                old = leader[1].node("n1")
                assert old is not None and not old.connected
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def test_the_connection_holding_the_lock_has_keepalives_at_both_ends(postgres_url: str) -> None:
    """A leader whose machine vanishes must lose its lock within seconds, and notice it the same."""
    async with plane(postgres_url, "cp1", "198.18.0.1:7443") as leader:
        await eventually(lambda: leader.leading, ELECTED_S)
        settings = await leader.use(
            lambda c: c.fetchrow(
                "SELECT current_setting('tcp_keepalives_idle') AS idle,"
                " current_setting('tcp_keepalives_count') AS count,"
                " current_setting('tcp_user_timeout') AS unacknowledged"
            )
        )
        assert (settings["idle"], settings["count"], settings["unacknowledged"]) == ("3", "3", "6000")
        sock = await leader.use(lambda c: _socket(c))
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1


async def _socket(connection: asyncpg.Connection) -> socket.socket:
    return connection._transport.get_extra_info("socket")  # type: ignore[no-any-return]
