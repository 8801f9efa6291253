"""Engines a gateway on another host can reach: the node's address, engine_ports, engine_bind, the secret.

The supervisor starts real sim processes; the agent's stream is the real agent
service over mutual TLS on loopback; tests/fleet holds the same across hosts
made of network namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import attrs
import psutil
import pytest
from structlog.testing import capture_logs

from llmgw import pki
from llmgw.agent import state as engine_state
from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.config import AgentConfig, ServerConfig, TLSConfig
from llmgw.control.inventory import Inventory
from llmgw.control.stream.service import serve_agents
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.engines.registry import ENGINES
from llmgw.engines.sim import SimEngine
from llmgw.proto.llmgw import v1 as pb

from .reports import WAIT_S, Reports

SECRET = "a-secret-only-the-gateway-holds"


def _start(shard_id: str = "s1", secret: str = SECRET) -> pb.StartShard:
    return pb.StartShard(shard_id=shard_id, model="sim-chat", engine="sim", engine_secret=secret)


async def _chat(endpoint: str, secret: str | None) -> int:
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hello"}]}
    headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(endpoint + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        return response.status


def _port_of(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2])


@contextlib.asynccontextmanager
async def _supervisor(
    reports: Reports, engines: Mapping[str, Engine] = ENGINES, **kwargs: object
) -> AsyncIterator[Supervisor]:
    with tempfile.TemporaryDirectory() as state_dir:
        async with Supervisor(
            engines,
            reports,
            ready_timeout_s=WAIT_S,
            state_dir=Path(state_dir),
            **kwargs,  # type: ignore[arg-type]
        ) as supervisor:
            yield supervisor


class TestWhereEnginesListen:
    async def test_an_engine_listens_on_a_port_of_engine_ports_and_is_advertised_at_the_nodes_address(
        self,
    ) -> None:
        reports = Reports()
        # 127.0.0.2 stands for the node's address: it is not where the engine was told to listen.
        async with _supervisor(reports, host="127.0.0.2", bind="127.0.0.1", ports=range(20500, 20600)) as sup:
            await sup.start(_start())
            ready = await reports.wait_for("ready")
            assert ready.endpoint.startswith("http://127.0.0.2:")
            port = _port_of(ready.endpoint)
            assert port in range(20500, 20600)
            # It listens where engine_bind said, and the agent found it healthy there.
            assert await _chat(f"http://127.0.0.1:{port}", SECRET) == 200

    async def test_a_new_advertised_address_leaves_running_engines_where_they_are(self) -> None:
        reports = Reports()
        async with _supervisor(reports, bind="127.0.0.1") as sup:
            await sup.start(_start("s1"))
            first = await reports.wait_for("ready", "s1")
            # The agent reconnected through another server address, and its local address changed.
            sup.advertise("127.0.0.3")
            await sup.start(_start("s2"))
            second = await reports.wait_for("ready", "s2")
            assert first.endpoint.startswith("http://127.0.0.1:")
            assert second.endpoint.startswith("http://127.0.0.3:")
            assert [s.endpoint for s in sup.statuses()] == [first.endpoint, second.endpoint]

    async def test_a_replica_that_finds_no_free_port_in_engine_ports_fails_saying_so(self) -> None:
        reports = Reports()
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            async with _supervisor(reports, ports=range(port, port + 1)) as sup:
                await sup.start(_start())
                failed = await reports.wait_for("failed")
        assert failed.detail.startswith(
            f"no free port in engine_ports {port}-{port} on 127.0.0.1: all 1 are taken"
        )


class TestTheSecret:
    async def test_the_engine_refuses_callers_without_the_replicas_secret_and_it_is_not_on_its_command_line(
        self,
    ) -> None:
        reports = Reports()
        async with _supervisor(reports) as sup:
            await sup.start(_start())
            ready = await reports.wait_for("ready")
            assert await _chat(ready.endpoint, None) == 401
            assert await _chat(ready.endpoint, "a guess") == 401
            assert await _chat(ready.endpoint, SECRET) == 200
            # Reported back, for a control plane that restarts and must reach the engine again.
            assert ready.engine_secret == SECRET
            process = psutil.Process(ready.pid)
            assert SECRET not in " ".join(await asyncio.to_thread(process.cmdline))

    async def test_an_engine_that_prints_its_secret_has_it_blotted_out_of_its_output_and_the_agents_log(
        self,
    ) -> None:
        @attrs.frozen
        class Chatty(Engine):
            """The sim, started the way SGLang is: the secret on its command line, which it prints."""

            name: str = "sim"
            health_path: str = "/health"
            metrics_path: str = "/metrics"

            def command(self, spec: LaunchSpec) -> list[str]:
                return [
                    "sh",
                    "-c",
                    f'echo "server_args: api_key=$1"; exec {sys.executable} -m llmgw.engines.sim '
                    f"--host {spec.host} --port {spec.port} --model {spec.model}",
                    "sh",
                    spec.secret,
                ]

            def environment(self, spec: LaunchSpec) -> dict[str, str]:
                return SimEngine().environment(spec)

            def probe_command(self, binary: str) -> list[str]:
                return []

        reports = Reports()
        with capture_logs() as logs:
            async with _supervisor(reports, {"sim": Chatty()}) as sup:
                await sup.start(_start())
                await reports.wait_for("ready")
                output = sup.output("s1")
        assert "server_args: api_key=[secret]" in output
        assert SECRET not in "\n".join(output)
        assert SECRET not in repr(logs)
        assert any("[secret]" in str(entry.get("argv")) for entry in logs)


class TestTheStateFile:
    def test_the_state_file_is_readable_by_the_agents_user_alone(self, tmp_path: Path) -> None:
        # An older agent left it readable by everyone.
        (tmp_path / engine_state.STATE_FILE).write_text('{"shards": []}')
        (tmp_path / engine_state.STATE_FILE).chmod(0o644)
        (tmp_path / (engine_state.STATE_FILE + ".tmp")).write_text("")
        (tmp_path / (engine_state.STATE_FILE + ".tmp")).chmod(0o644)
        record = engine_state.EngineRecord(_start(), 1, 1, "http://127.0.0.1:20001", "x.log")
        engine_state.write_state(tmp_path, [record])
        mode = stat.S_IMODE((tmp_path / engine_state.STATE_FILE).stat().st_mode)
        assert mode == 0o600
        (back,) = engine_state.read_state(tmp_path)
        assert back.request.engine_secret == SECRET


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[TLSConfig, TLSConfig]:
    """(a server certificate naming loopback, n1's certificate)."""
    root = tmp_path_factory.mktemp("pki")
    pki.init_ca(root / "ca")
    ca = str(root / "ca" / "ca.pem")
    server = pki.issue_server(root / "ca", "control", ["127.0.0.1"], root / "server")
    n1 = pki.issue_agent(root / "ca", "n1", root / "n1")
    return (
        TLSConfig(ca=ca, cert=str(server[0]), key=str(server[1])),
        TLSConfig(ca=ca, cert=str(n1[0]), key=str(n1[1])),
    )


class TestTheAdvertisedAddress:
    async def _registered(self, server_tls: TLSConfig, agent_cfg: AgentConfig) -> tuple[str, list[str]]:
        """(the address the node advertised in its Register, what the supervisor was told)."""
        advertised: list[str] = []

        class Idle:
            on_status = None

            def advertise(self, address: str) -> None:
                advertised.append(address)

            async def start(self, req: pb.StartShard) -> None: ...

            async def stop(self, shard_id: str) -> None: ...

            def statuses(self) -> list[pb.ShardStatus]:
                return []

            async def remove_weights(self, sources: list[str]) -> tuple[list[str], list[str]]:
                return [], []

            def output(self, shard_id: str) -> list[str]:
                return []

            def sources(self) -> list[str]:
                return []

        inventory = Inventory(5.0)
        cfg = ServerConfig(agent_listen="127.0.0.1:0", tls=server_tls)
        async with serve_agents(cfg, inventory) as port:
            host = agent_cfg.servers[0]
            client = AgentClient(
                attrs.evolve(agent_cfg, servers=[f"{host}:{port}"]), Idle(), {"sim": "1"}, backoff_max_s=0.1
            )
            task = asyncio.create_task(client.run())
            try:
                await asyncio.wait_for(client.connected.wait(), 10)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        node = inventory.node("n1")
        assert node is not None
        return node.advertise_address, advertised

    # A node on another host advertising its connection's own address (not loopback's) is held
    # by tests/fleet, where the control plane and the node are hosts of their own.

    async def test_over_loopback_a_node_stays_on_loopback(
        self, certificates: tuple[TLSConfig, TLSConfig]
    ) -> None:
        server_tls, n1 = certificates
        agent_cfg = AgentConfig(node_id="n1", servers=["127.0.0.1"], tls=n1)
        assert await self._registered(server_tls, agent_cfg) == ("127.0.0.1", ["127.0.0.1"])

    async def test_an_advertise_address_in_agent_yaml_wins_over_the_connections(
        self, certificates: tuple[TLSConfig, TLSConfig]
    ) -> None:
        server_tls, n1 = certificates
        # Built directly, past the load-time check that the address is this machine's.
        agent_cfg = AgentConfig(
            node_id="n1",
            servers=["127.0.0.1"],
            tls=n1,
            advertise_address="127.0.0.2",
            fabric_address="127.0.0.2",
        )
        assert await self._registered(server_tls, agent_cfg) == ("127.0.0.2", ["127.0.0.2"])
