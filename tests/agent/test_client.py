"""The agent's stream to a real agent service over mutual TLS on loopback, with a fake supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
from structlog.testing import capture_logs

from llmgw import keepalive, pki
from llmgw.agent import client
from llmgw.agent.client import AgentClient, dial_bound
from llmgw.backoff import ExponentialBackoff
from llmgw.catalog import Catalog
from llmgw.config import AgentConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig, TLSConfig
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb

from ..waiting import eventually


@attrs.frozen
class Certs:
    server: TLSConfig
    n1: TLSConfig
    # n1's certificate signed by an authority the server does not know.
    stranger: TLSConfig
    # n1's own certificate, but trusting another authority than the one that signed the server's.
    distrustful: TLSConfig


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("pki")
    pki.init_ca(root / "ca")
    pki.init_ca(root / "other")
    ca, other = str(root / "ca" / "ca.pem"), str(root / "other" / "ca.pem")
    server = pki.issue_server(root / "ca", "control", ["127.0.0.1", "localhost"], root / "server")
    n1 = pki.issue_agent(root / "ca", "n1", root / "n1")
    stranger = pki.issue_agent(root / "other", "n1", root / "stranger")
    return Certs(
        server=TLSConfig(ca=ca, cert=str(server[0]), key=str(server[1])),
        n1=TLSConfig(ca=ca, cert=str(n1[0]), key=str(n1[1])),
        stranger=TLSConfig(ca=ca, cert=str(stranger[0]), key=str(stranger[1])),
        distrustful=TLSConfig(ca=other, cert=str(n1[0]), key=str(n1[1])),
    )


class FakeSupervisor:
    """Starts nothing: reports starting, then ready on a made-up port, as the real one would."""

    def __init__(self, *running: pb.ShardStatus, refuse: Exception | None = None) -> None:
        self.on_status: Callable[[pb.ShardStatus], None] | None = None
        self.started: list[pb.StartShard] = []
        self.stopped: list[str] = []
        self._statuses = {s.shard_id: s for s in running}
        self._refuse = refuse
        self.advertised: list[str] = []

    def advertise(self, address: str) -> None:
        self.advertised.append(address)

    async def start(self, req: pb.StartShard) -> None:
        if self._refuse is not None:
            raise self._refuse
        self.started.append(req)
        for state, endpoint in (("starting", ""), ("ready", f"http://127.0.0.1:{9000 + len(self.started)}")):
            self._report(
                pb.ShardStatus(
                    shard_id=req.shard_id, model=req.model, engine=req.engine, state=state, endpoint=endpoint
                )
            )

    async def stop(self, shard_id: str) -> None:
        self.stopped.append(shard_id)
        status = self._statuses.pop(shard_id, pb.ShardStatus(shard_id=shard_id))
        self._report(
            pb.ShardStatus(shard_id=shard_id, model=status.model, engine=status.engine, state="stopped")
        )

    def statuses(self) -> list[pb.ShardStatus]:
        return list(self._statuses.values())

    def _report(self, status: pb.ShardStatus) -> None:
        self._statuses[status.shard_id] = status
        if self.on_status is not None:
            self.on_status(status)


def server_config(certs: Certs, *models: ModelConfig, listen: str = "127.0.0.1:0") -> ServerConfig:
    return ServerConfig(
        agent_listen=listen,
        tls=certs.server,
        models=list(models),
        control=ControlConfig(interval_s=0.05, grace_s=5.0),
    )


def agent_config(tls: TLSConfig, *ports: int, node_id: str = "n1") -> AgentConfig:
    return AgentConfig(
        node_id=node_id, servers=[f"127.0.0.1:{p}" for p in ports], tls=tls, heartbeat_interval_s=0.05
    )


@asynccontextmanager
async def running(client: AgentClient) -> AsyncIterator[AgentClient]:
    task = asyncio.create_task(client.run())
    try:
        yield client
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def agent(cfg: AgentConfig, supervisor: FakeSupervisor) -> AgentClient:
    return AgentClient(cfg, supervisor, {"sim": "1"}, backoff_base_s=0.02, backoff_max_s=0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def logged(logs: list[dict[str, object]], words: str) -> bool:
    return any(words in str(entry.get("error", "")) for entry in logs)


async def test_the_agent_registers_and_heartbeats(certs: Certs):
    inventory = Inventory(5.0)
    async with (
        serve_agents(server_config(certs), inventory) as port,
        running(agent(agent_config(certs.n1, port), FakeSupervisor())) as client,
    ):
        await asyncio.wait_for(client.connected.wait(), 5)
        node = inventory.node("n1")
        assert node is not None and node.engine_versions == {"sim": "1"} and node.engines_probed
        first_seen = node.last_seen
        await eventually(lambda: node.last_seen > first_seen)


async def test_a_server_that_accepts_the_connection_but_answers_nothing_is_given_up_on_for_the_next(
    certs: Certs,
):
    # As a machine that vanished behind a router, or one whose process is frozen: without a bound on
    # the dial, the agent would wait on it (the TLS handshake's 60 s, or the kernel's 2 min) for ever
    # and never reach the server after it.
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    mute = await asyncio.start_server(silent, "127.0.0.1", 0)
    inventory = Inventory(5.0)
    try:
        with capture_logs() as logs:
            async with serve_agents(server_config(certs), inventory) as port:
                cfg = agent_config(certs.n1, mute.sockets[0].getsockname()[1], port)
                quick = AgentClient(
                    cfg,
                    FakeSupervisor(),
                    {"sim": "1"},
                    backoff_base_s=0.02,
                    backoff_max_s=0.1,
                    dial_timeout_s=0.3,
                )
                async with running(quick) as connected:
                    await asyncio.wait_for(connected.connected.wait(), 5)
        assert logged(logs, "no answer within 0.3 s"), logs
    finally:
        for writer in held:
            writer.close()
        mute.close()
        await mute.wait_closed()


async def test_a_server_too_busy_to_answer_within_the_bound_is_given_longer_each_round(certs: Certs):
    # As a control plane taking a whole fleet's handshakes at once after a takeover: were the bound
    # fixed, every node would give up on it before its turn came, round after round, for ever.
    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.5)
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        async with asyncio.TaskGroup() as group:
            group.create_task(pipe(reader, upstream_writer))
            group.create_task(pipe(upstream_reader, writer))

    inventory = Inventory(5.0)
    slow = await asyncio.start_server(late, "127.0.0.1", 0)
    try:
        with capture_logs() as logs:
            async with serve_agents(server_config(certs), inventory) as port:
                cfg = agent_config(certs.n1, slow.sockets[0].getsockname()[1])
                patient = AgentClient(
                    cfg,
                    FakeSupervisor(),
                    {"sim": "1"},
                    backoff_base_s=0.02,
                    backoff_max_s=0.1,
                    dial_timeout_s=0.2,
                )
                async with running(patient) as client:
                    await asyncio.wait_for(client.connected.wait(), 10)
        assert logged(logs, "no answer within 0.2 s") and logged(logs, "no answer within 0.4 s"), logs
    finally:
        slow.close()


def test_the_dial_bound_doubles_each_round_without_a_server_and_stops_at_its_ceiling():
    assert [dial_bound(3.0, n) for n in range(6)] == [3.0, 6.0, 12.0, 24.0, 30.0, 30.0]
    assert dial_bound(3.0, 10_000) == 30.0


async def test_the_agent_fails_over_to_the_next_server_in_order(certs: Certs):
    inventory = Inventory(5.0)
    dead = free_port()
    async with (
        serve_agents(server_config(certs), inventory) as port,
        running(agent(agent_config(certs.n1, dead, port), FakeSupervisor())) as client,
    ):
        await asyncio.wait_for(client.connected.wait(), 5)
        assert client.server == f"127.0.0.1:{port}"


async def test_a_catalog_model_is_started_on_the_node_and_becomes_routable(certs: Certs):
    model = ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim", args=["-x"])])
    cfg = server_config(certs, model)
    inventory = Inventory(5.0)
    supervisor = FakeSupervisor()
    async with serve_agents(cfg, inventory) as port, asyncio.TaskGroup() as tasks:
        reconciling = tasks.create_task(Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).run())
        async with running(agent(agent_config(certs.n1, port), supervisor)):
            await eventually(lambda: inventory.ready_endpoints("sim-chat"))
        reconciling.cancel()
    (start,) = supervisor.started
    assert (start.model, start.engine, start.args) == ("sim-chat", "sim", ["-x"])
    assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:9001",)


async def test_a_stop_order_reaches_the_supervisor_and_the_shard_leaves_the_inventory(certs: Certs):
    inventory = Inventory(5.0)
    supervisor = FakeSupervisor(pb.ShardStatus(shard_id="s1", model="sim-chat", engine="sim", state="ready"))
    async with (
        serve_agents(server_config(certs), inventory) as port,
        running(agent(agent_config(certs.n1, port), supervisor)) as client,
    ):
        await asyncio.wait_for(client.connected.wait(), 5)
        assert [r.shard_id for r in inventory.replicas()] == ["s1"]
        await inventory.send("n1", pb.ControlMessage(stop=pb.StopShard(shard_id="s1", reason="test")))
        await eventually(lambda: not inventory.replicas())
    assert supervisor.stopped == ["s1"]


async def test_shards_already_running_are_adopted_when_the_agent_registers(certs: Certs):
    inventory = Inventory(5.0)
    supervisor = FakeSupervisor(
        pb.ShardStatus(
            shard_id="s0", model="sim-chat", engine="sim", state="ready", endpoint="http://127.0.0.1:7"
        )
    )
    async with (
        serve_agents(server_config(certs), inventory) as port,
        running(agent(agent_config(certs.n1, port), supervisor)) as client,
    ):
        await asyncio.wait_for(client.connected.wait(), 5)
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:7",)


async def test_a_start_the_supervisor_cannot_carry_out_is_reported_failed(certs: Certs):
    inventory = Inventory(5.0)
    supervisor = FakeSupervisor(refuse=LlmgwError("node n1 does not have the sim engine"))
    async with (
        serve_agents(server_config(certs), inventory) as port,
        running(agent(agent_config(certs.n1, port), supervisor)) as client,
    ):
        await asyncio.wait_for(client.connected.wait(), 5)
        start = pb.StartShard(shard_id="s1", model="sim-chat", engine="sim")
        await inventory.send("n1", pb.ControlMessage(start=start))
        await eventually(lambda: inventory.replicas())
        assert inventory.why_no_ready("sim-chat") == (
            "sim-chat has no ready replica: failed on n1: node n1 does not have the sim engine"
        )


async def test_the_agent_reconnects_after_the_server_restarts(certs: Certs):
    first, restarted = Inventory(5.0), Inventory(5.0)
    async with contextlib.AsyncExitStack() as server:
        port = await server.enter_async_context(serve_agents(server_config(certs), first))
        client = agent(agent_config(certs.n1, port), FakeSupervisor())
        async with running(client):
            await asyncio.wait_for(client.connected.wait(), 5)
            await server.aclose()
            await eventually(lambda: not client.connected.is_set())
            # A restarted server comes back on the same address.
            async with serve_agents(server_config(certs, listen=f"127.0.0.1:{port}"), restarted):
                await asyncio.wait_for(client.connected.wait(), 5)
                assert restarted.node("n1") is not None


async def test_an_agent_registering_as_another_node_is_refused_and_told_why(certs: Certs):
    inventory = Inventory(5.0)
    async with serve_agents(server_config(certs), inventory) as port:
        with capture_logs() as logs:
            async with running(agent(agent_config(certs.n1, port, node_id="n2"), FakeSupervisor())):
                await eventually(lambda: logged(logs, "a node may only register as itself"))
    assert logged(logs, "node n2 presented a certificate for n1: a node may only register as itself")
    assert inventory.nodes() == []


async def test_an_agent_whose_certificate_another_authority_signed_is_refused_and_told_why(certs: Certs):
    inventory = Inventory(5.0)
    async with serve_agents(server_config(certs), inventory) as port:
        with capture_logs() as logs:
            async with running(agent(agent_config(certs.stranger, port), FakeSupervisor())):
                await eventually(lambda: logged(logs, "is not signed by the certificate authority"))
    assert inventory.nodes() == []
    assert logged(
        logs, f"{Path(certs.stranger.cert)} is not signed by the certificate authority {certs.stranger.ca}"
    )


async def test_a_server_whose_certificate_this_node_does_not_trust_is_refused(certs: Certs):
    inventory = Inventory(5.0)
    async with serve_agents(server_config(certs), inventory) as port:
        with capture_logs() as logs:
            async with running(agent(agent_config(certs.distrustful, port), FakeSupervisor())):
                await eventually(lambda: logged(logs, "presented a certificate this node does not trust"))
    assert inventory.nodes() == []


def test_the_reconnect_backoff_doubles_up_to_its_cap_and_is_jittered() -> None:
    client = AgentClient(
        AgentConfig(node_id="n1"), FakeSupervisor(), {}, backoff_base_s=0.5, backoff_max_s=30
    )
    # The first wait follows a stream that ended after its Register; each round of refusals doubles it.
    for failures, ceiling in [(1, 0.5), (2, 1.0), (4, 4.0), (7, 30.0), (61, 30.0)]:
        waits = [client._backoff.delay(failures) for _ in range(200)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        # A fleet that lost its control plane at once must not dial back at once.
        assert len(set(waits)) > 100


class TestHeartbeatJitter:
    def test_a_heartbeat_goes_up_to_a_fifth_early_and_never_late(self) -> None:
        assert client.beat_gap(5.0, lambda: 0.0) == 5.0
        assert client.beat_gap(5.0, lambda: 1.0) == pytest.approx(4.0)

    def test_nodes_that_connected_together_drift_apart(self) -> None:
        rng = random.Random(21)
        # Ten nodes, each beating at its own jittered gaps from the same instant.
        times = [sum(client.beat_gap(5.0, rng.random) for _ in range(10)) for _ in range(10)]
        assert max(times) - min(times) > 1.0
        assert all(t <= 50.0 for t in times)


async def test_the_stream_to_the_control_plane_has_keepalives_so_a_vanished_machine_is_noticed(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
):
    """A control plane whose machine vanished says nothing: the agent must notice and dial the next."""
    options: list[tuple[int, int]] = []

    def keep_alive(transport: object) -> bool:
        done = keepalive.keep_alive(transport)
        sock = transport.get_extra_info("socket")  # type: ignore[attr-defined]
        options.append(
            (
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            )
        )
        return done

    monkeypatch.setattr(client, "keep_alive", keep_alive)
    async with (
        serve_agents(server_config(certs), Inventory(5.0)) as port,
        running(agent(agent_config(certs.n1, port), FakeSupervisor())) as connected,
    ):
        await asyncio.wait_for(connected.connected.wait(), 5)
    assert options == [(1, int(keepalive.UNACKNOWLEDGED_S * 1000))]


def test_while_standbys_answer_the_wait_between_rounds_stays_short_however_long_it_has_failed() -> None:
    backoff = ExponentialBackoff(base_s=0.5, cap_s=30.0)
    failures = 0
    for _ in range(20):
        failures = client.failures_after(failures, registered=False, standby=True)
        assert backoff.delay(failures) <= 2.0
    # Without a standby answering, the wait grows as for any failure.
    for _ in range(5):
        failures = client.failures_after(failures, registered=False, standby=False)
    assert backoff.delay(failures) > 2.0
    assert client.failures_after(failures, registered=True, standby=False) == 1


async def test_an_agent_outside_the_servers_version_window_logs_the_refusal_in_words(certs: Certs):
    inventory = Inventory(5.0)
    reasons: list[str] = []
    # This agent runs llmgw.__version__ (0.x); a server ten minors ahead is out of its reach.
    async with serve_agents(
        server_config(certs), inventory, refused=reasons.append, version="0.99.0"
    ) as port:
        with capture_logs() as logs:
            async with running(agent(agent_config(certs.n1, port), FakeSupervisor())):
                await eventually(lambda: logged(logs, "is older than this server accepts (0.98–0.100)"))
    # The agent's own entry, not the server's (both log to the same capture here).
    refusal = next(
        entry for entry in logs if entry["event"] == "the control plane refused this agent's version"
    )
    assert refusal["log_level"] == "error"
    assert "upgrade it (docs/operations.md, Versions)" in str(refusal["error"])
    assert inventory.nodes() == [] and "version" in reasons


def test_a_refusal_of_the_agents_version_waits_the_longest_before_the_next_round() -> None:
    # A fleet of refused agents must not dial several times a second until someone upgrades them.
    failures = client.failures_after(0, registered=False, standby=False, outdated=True)
    backoff = ExponentialBackoff(base_s=0.5, cap_s=30.0)
    assert backoff.delay(failures) == 30.0
    # A standby's refusal still keeps the wait short: a leader of this version may take over within seconds.
    assert client.failures_after(0, registered=False, standby=True, outdated=True) <= client.STANDBY_FAILURES
