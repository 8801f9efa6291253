"""An install's outcome travels the real stream: Provision down, heartbeats up, placement reads them.

The control plane's agent service over mutual TLS on loopback, the agent's
real client and provision loop, the fake publisher and machine of this
directory's conftest: the only fakes are the internet and the package tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from llmgw import pki
from llmgw.adminapi import handlers as adminapi
from llmgw.agent.client import AgentClient
from llmgw.agent.discovery.host import NO_AVX2_WARNING, Host
from llmgw.agent.provision.loop import ProvisionLoop
from llmgw.agent.provision.release import ReleaseClient
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.config import (
    AgentConfig,
    ControlConfig,
    EngineOptions,
    ModelConfig,
    ProfileConfig,
    ProvisionConfig,
    ServerConfig,
    TLSConfig,
)
from llmgw.control.inventory import Inventory
from llmgw.control.placement import Scheduler
from llmgw.control.stream.service import serve_agents
from llmgw.proto.llmgw import v1 as pb

from ...waiting import eventually

# x64 without AVX2: a VM on QEMU's default CPU model.
SLOW_VM = Host(os_id="ubuntu", os_version="24.04", id_like=("debian",), arch="amd64", cpu_flags=("avx",))


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


class IdleSupervisor:
    """Runs no shard: these tests are about engines, not replicas."""

    def __init__(self) -> None:
        self.on_status: Callable[[pb.ShardStatus], None] | None = None

    def advertise(self, address: str) -> None:
        pass

    async def start(self, req: pb.StartShard) -> None:
        raise AssertionError("nothing should be started")

    async def stop(self, shard_id: str) -> None:
        pass

    def statuses(self) -> list[pb.ShardStatus]:
        return []

    def output(self, shard_id: str) -> list[str]:
        return []

    def sources(self) -> list[str]:
        return []


@attrs.define
class Cluster:
    inventory: Inventory
    loop: ProvisionLoop
    client: AgentClient


@contextlib.asynccontextmanager
async def running_cluster(
    tmp_path: Path, certs: Certs, machine: Any, releases: ReleaseClient, engines: dict[str, EngineOptions]
) -> AsyncIterator[Cluster]:
    """The control plane's agent service, and one agent n1 whose agent.yaml names engines."""
    server_cfg = ServerConfig(
        agent_listen="127.0.0.1:0",
        tls=certs.server,
        engines={"llamacpp": "b1"},
        control=ControlConfig(grace_s=5.0),
    )
    inventory = Inventory(server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port:
        agent_cfg = AgentConfig(
            node_id="n1",
            servers=[f"127.0.0.1:{port}"],
            tls=certs.n1,
            heartbeat_interval_s=0.05,
            state_dir=str(tmp_path / "agent"),
            engines=engines,
            provision=ProvisionConfig(dir=str(tmp_path / "engines")),
        )
        loop = ProvisionLoop(agent_cfg, SLOW_VM, machine, releases, lock_retry_s=0.0)
        await loop.probe_configured()
        client = AgentClient(
            agent_cfg,
            IdleSupervisor(),
            {"sim": "builtin"},
            provision=loop,
            host=SLOW_VM.to_proto(),
            warnings=SLOW_VM.warnings(),
            backoff_base_s=0.02,
            backoff_max_s=0.1,
        )
        async with asyncio.TaskGroup() as tasks:
            owned = [tasks.create_task(loop.run()), tasks.create_task(client.run())]
            try:
                yield Cluster(inventory, loop, client)
            finally:
                for task in owned:
                    task.cancel()


@pytest.fixture
async def cluster(
    tmp_path: Path, certs: Certs, machine: Any, releases: ReleaseClient
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path, certs, machine, releases, {}) as running:
        yield running


def llama_model() -> ModelConfig:
    return ModelConfig(name="llama", profiles=[ProfileConfig(engine="llamacpp")])


async def test_the_outcome_reaches_a_heartbeat(cluster: Cluster, release: Any) -> None:
    """Register says what the machine is; the install's progress and outcome arrive by heartbeat."""
    release.hold_downloads = asyncio.Event()
    inventory = cluster.inventory
    await eventually(lambda: inventory.node("n1") is not None)
    node = inventory.node("n1")
    assert node is not None
    assert node.host is not None and (node.host.arch, node.host.family) == ("amd64", "deb")
    assert node.warnings == [NO_AVX2_WARNING]
    assert node.engines_probed and node.engine_versions == {"sim": "builtin"}

    # The Provision sent at registration started an install; the node says where it stands.
    await eventually(
        lambda: [p.state for p in node.provision] == ["installing"] and release.download_started.is_set()
    )
    await eventually(
        lambda: node.provision[0].detail.startswith("downloading llama-b1-bin-ubuntu-x64.tar.gz")
    )
    (verdict,) = Scheduler.for_inventory(inventory, ServerConfig(), []).explain(llama_model())
    assert verdict.reason.startswith(
        "does not have llamacpp installed (installing: downloading llama-b1-bin-ubuntu-x64.tar.gz"
    )

    release.hold_downloads.set()
    await eventually(lambda: node.engine_versions == {"sim": "builtin", "llamacpp": "b1"})
    await eventually(lambda: [p.state for p in node.provision] == ["ready"])
    (status,) = node.provision
    assert (status.engine, status.version, status.variant) == ("llamacpp", "b1", "cpu")
    assert "this CPU lacks avx2" in status.detail
    (verdict,) = Scheduler.for_inventory(inventory, ServerConfig(), []).explain(llama_model())
    assert verdict.candidate


async def test_a_node_whose_interpreter_cannot_import_sglang_is_skipped_saying_why(
    tmp_path: Path, certs: Certs, machine: Any, releases: ReleaseClient
) -> None:
    """agent.yaml names an interpreter without SGLang: `ctl explain` gives the node's own sentence."""
    python = sys.executable  # the one running these tests, which has no sglang
    sglang_model = ModelConfig(name="chat", profiles=[ProfileConfig(engine="sglang")])
    engines = {"sglang": EngineOptions(binary=python)}
    async with running_cluster(tmp_path, certs, machine, releases, engines) as running:
        inventory = running.inventory
        await eventually(lambda: inventory.node("n1") is not None)
        node = inventory.node("n1")
        assert node is not None
        await eventually(lambda: any(p.engine == "sglang" for p in node.provision))
        assert "sglang" not in node.engine_versions
        why = (
            f"does not have sglang installed (failed: {python} cannot import sglang: "
            "ModuleNotFoundError: No module named 'sglang')"
        )
        (verdict,) = Scheduler.for_inventory(inventory, ServerConfig(), []).explain(sglang_model)
        assert verdict.reason == why

        cfg = ServerConfig(models=[sglang_model])
        app = web.Application()
        adminapi.install(app, cfg, inventory, Catalog(cfg))
        async with TestServer(app) as admin:
            url = str(admin.make_url("")).rstrip("/")
            # In a thread: ctl runs its own event loop, and the admin API runs on this one.
            result = await asyncio.to_thread(
                CliRunner().invoke, ctl, ["--server", url, "explain", "chat"], catch_exceptions=False
            )
        assert result.exit_code == 0, result.output
        (row,) = [line for line in result.stdout.splitlines() if " n1 " in line]
        assert row.split(None, 3)[2:] == ["no", why]
