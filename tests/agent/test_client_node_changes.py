"""What changes on a node reaches the server over the real stream (mutual TLS on loopback), and back.

A real Supervisor running the sim engine on a real WeightsCache, the agent's
NodeReport, and the server's agent service and inventory: RemoveWeights down
the stream, weights and storage up it in heartbeats.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import pytest
from aiohttp import web

from llmgw import pki
from llmgw.agent.client import AgentClient
from llmgw.agent.discovery.node import NodeReport
from llmgw.agent.discovery.storage import Statvfs
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.weights import WeightsCache
from llmgw.config import AgentConfig, ControlConfig, ServerConfig, TLSConfig
from llmgw.control.inventory import Inventory, Node
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES
from llmgw.proto.llmgw import v1 as pb

GB = 10**9
WAIT_S = 30.0


@attrs.frozen
class Certs:
    server: TLSConfig
    n1: TLSConfig


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("pki")
    pki.init_ca(root / "ca")
    ca = str(root / "ca" / "ca.pem")
    server = pki.issue_server(root / "ca", "control", ["127.0.0.1"], root / "server")
    n1 = pki.issue_agent(root / "ca", "n1", root / "n1")
    return Certs(
        server=TLSConfig(ca=ca, cert=str(server[0]), key=str(server[1])),
        n1=TLSConfig(ca=ca, cert=str(n1[0]), key=str(n1[1])),
    )


@pytest.fixture
async def origin() -> AsyncIterator[str]:
    """An HTTP server with two small GGUF files; yields its base URL."""
    app = web.Application()

    async def weights(_: web.Request) -> web.Response:
        return web.Response(body=b"GGUF" + b"\0" * 4096)

    app.router.add_get("/{name}.gguf", weights)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


class FakeDisk:
    """statvfs of a 100 GB disk whose free space the test sets; called from discovery's thread."""

    def __init__(self, free_bytes: int) -> None:
        self._lock = threading.Lock()
        self._free = free_bytes

    def set_free(self, free_bytes: int) -> None:
        with self._lock:
            self._free = free_bytes

    def __call__(self, _: Path) -> os.statvfs_result:
        with self._lock:
            free = self._free
        block = 4096
        return os.statvfs_result(
            (block, block, 100 * GB // block, free // block, free // block, 0, 0, 0, 0, 255)
        )


class RecordingInventory(Inventory):
    """The server's inventory, remembering every heartbeat that changes something."""

    def __init__(self) -> None:
        super().__init__(grace_s=5.0)
        self.heartbeats: list[pb.Heartbeat] = []

    def heartbeat(self, node_id: str, heartbeat: pb.Heartbeat) -> None:
        self.heartbeats.append(heartbeat)
        super().heartbeat(node_id, heartbeat)


@attrs.define
class Agent:
    inventory: RecordingInventory
    supervisor: Supervisor
    cache: WeightsCache
    report: NodeReport

    def node(self) -> Node:
        node = self.inventory.node("n1")
        assert node is not None, "n1 never registered"
        return node


@asynccontextmanager
async def connected_agent(
    certs: Certs,
    tmp_path: Path,
    disk: Statvfs,
    state_dir: Path | None = None,
    heartbeat_interval_s: float = 0.05,
) -> AsyncIterator[Agent]:
    """Server and agent wired as the roles wire them, the agent registered; its state under state_dir."""
    server_cfg = ServerConfig(
        agent_listen="127.0.0.1:0", tls=certs.server, control=ControlConfig(interval_s=0.05, grace_s=5.0)
    )
    inventory = RecordingInventory()
    async with AsyncExitStack() as stack:
        port = await stack.enter_async_context(serve_agents(server_cfg, inventory))
        cfg = AgentConfig(
            node_id="n1",
            servers=[f"127.0.0.1:{port}"],
            tls=certs.n1,
            state_dir=str(state_dir or tmp_path / "agent"),
            heartbeat_interval_s=heartbeat_interval_s,
        )
        disk_changed = asyncio.Event()
        cache = await stack.enter_async_context(WeightsCache(cfg.weights_dir, on_disk_full=disk_changed.set))
        supervisor = await stack.enter_async_context(
            Supervisor(ENGINES, ready_timeout_s=WAIT_S, weights=cache, state_dir=Path(cfg.state_dir))
        )
        report = NodeReport(
            cfg,
            weights=lambda: cache.present(supervisor.weights_in_use()),
            infiniband=tmp_path / "no-infiniband",
            statvfs=disk,
            disk_changed=disk_changed,
        )
        await report.refresh()
        client = AgentClient(
            cfg, supervisor, {"sim": "1"}, backoff_base_s=0.02, backoff_max_s=0.1, report=report
        )
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        for task in (
            tasks.create_task(client.run()),
            tasks.create_task(report.run(cfg.heartbeat_interval_s)),
        ):
            stack.callback(task.cancel)
        await asyncio.wait_for(client.connected.wait(), WAIT_S)
        yield Agent(inventory, supervisor, cache, report)


async def eventually(predicate: Callable[[], object], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


def sources(node: Node) -> dict[str, bool]:
    """source -> whether an engine has it open, as the server last heard."""
    return {w.source: w.in_use for w in node.weights}


async def test_remove_weights_over_the_stream_deletes_what_no_engine_uses_and_keeps_what_one_has_open(
    certs: Certs, tmp_path: Path, origin: str
) -> None:
    """Both sources asked for: a server's plan can predate the StartShard that opened one of them."""
    opened, stale = f"{origin}/open.gguf", f"{origin}/stale.gguf"
    async with connected_agent(certs, tmp_path, FakeDisk(50 * GB)) as agent:
        await agent.inventory.send(
            "n1",
            pb.ControlMessage(start=pb.StartShard(shard_id="s1", model="m", engine="sim", source=opened)),
        )
        await eventually(lambda: agent.inventory.ready_endpoints("m"), "the engine never became ready")
        await agent.cache.fetch(stale, {})
        await eventually(
            lambda: sources(agent.node()) == {opened: True, stale: False},
            "the heartbeats never listed both weights",
        )
        stale_path, open_path = agent.cache.path_of(stale), agent.cache.path_of(opened)
        assert stale_path is not None and open_path is not None

        await agent.inventory.send(
            "n1", pb.ControlMessage(remove_weights=pb.RemoveWeights(sources=[opened, stale]))
        )
        await eventually(
            lambda: stale not in sources(agent.node()), "the removal never reached the server's inventory"
        )
        assert sources(agent.node()) == {opened: True}
        assert agent.cache.path_of(stale) is None
        assert not await asyncio.to_thread(stale_path.exists)
        assert agent.cache.path_of(opened) == open_path
        assert await asyncio.to_thread(open_path.exists)
        # The engine reading those weights serves on, on the same stream.
        assert agent.inventory.ready_endpoints("m")
        assert agent.inventory.registrations == 1


async def test_free_space_moving_under_the_weights_directory_reaches_the_inventory_in_a_heartbeat(
    certs: Certs, tmp_path: Path
) -> None:
    disk = FakeDisk(50 * GB)
    async with connected_agent(certs, tmp_path, disk) as agent:
        weights_dir = str(tmp_path / "agent" / "weights")
        ((path, total, free),) = [(s.path, s.total_bytes, s.free_bytes) for s in agent.node().storage]
        assert (path, free) == (weights_dir, 50 * GB // 4096 * 4096)

        disk.set_free(3 * GB)
        await eventually(
            lambda: [s.free_bytes for s in agent.node().storage] == [3 * GB // 4096 * 4096],
            "the inventory never heard the disk fill up",
        )
        (told,) = [h for h in agent.inventory.heartbeats if h.storage_changed]
        assert [(s.path, s.total_bytes) for s in told.storage] == [(weights_dir, total)]
        # A heartbeat, not a new Register, carried it.
        assert agent.inventory.registrations == 1


async def test_weights_that_answer_404_or_miss_their_pin_fail_the_shard_in_words_over_the_stream(
    certs: Certs, tmp_path: Path, origin: str
) -> None:
    """The failure the control plane hears names the file and the cause, never just "failed"."""
    body = b"GGUF" + b"\0" * 4096
    digest = hashlib.sha256(body).hexdigest()
    async with connected_agent(certs, tmp_path, FakeDisk(50 * GB)) as agent:
        starts = [
            pb.StartShard(shard_id="s404", model="m404", engine="sim", source=f"{origin}/gone.bin"),
            # The same URL twice: cached for the first model, still checked against the second's pin.
            pb.StartShard(shard_id="ok", model="ok", engine="sim", source=f"{origin}/a.gguf"),
        ]
        for start in starts:
            await agent.inventory.send("n1", pb.ControlMessage(start=start))
        await eventually(
            lambda: (
                {r.shard_id: r.state for r in agent.inventory.replicas()} == {"s404": "failed", "ok": "ready"}
            ),
            "the shards never settled",
        )
        wrong = pb.StartShard(
            shard_id="pin", model="pin", engine="sim", source=f"{origin}/a.gguf", sha256={"a.gguf": "0" * 64}
        )
        await agent.inventory.send("n1", pb.ControlMessage(start=wrong))
        await eventually(
            lambda: any(r.shard_id == "pin" and r.state == "failed" for r in agent.inventory.replicas()),
            "the wrongly pinned shard never failed",
        )
        details = {r.shard_id: r.detail for r in agent.inventory.replicas() if r.state == "failed"}
        assert details["s404"] == f"weights gone.bin: HTTP 404 at {origin}/gone.bin"
        assert details["pin"].startswith(
            f"weights a.gguf: sha256 does not match the pin (expected {'0' * 64}, got {digest})"
        )
