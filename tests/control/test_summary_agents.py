"""The one-line summary, provoked by real agents: what they report is what the three surfaces say.

tests/control/test_summary.py registers nodes with the words an agent would
use; here each node is a real agent stack (its client over mutual TLS, its
provision loop installing from a fake release host, or its supervisor running
the sim engine as a real process) dialling the control plane, which runs in
this process: agent service, inventory, reconciler, the gateway's engine
checks, admin listener and gateway. The 503 a client gets, `llmgw ctl models`
(or `ctl replicas`) and the models page are read over loopback and compared
to the same sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from llmgw import config, pki
from llmgw.adminapi import handlers as adminapi
from llmgw.agent.client import AgentClient
from llmgw.agent.provision.loop import ProvisionLoop
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.supervisor import Supervisor
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.config import (
    AgentConfig,
    AuthConfig,
    ModelConfig,
    ProbeConfig,
    ProfileConfig,
    ProvisionConfig,
    ServerConfig,
    TLSConfig,
)
from llmgw.control.engine_checks import EngineChecks
from llmgw.control.inventory import UNREACHABLE, Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store, open_store
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.context import WebContext

# The fake release host and machine of the installer's tests: their fixtures reach that directory alone.
from ..agent.provision.conftest import CPU_ASSET, UBUNTU, FakeMachine, FakeRelease, sha256

MODEL = "tiny"
WAIT_S = 30.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
# A failed install is tried again in ten minutes: the countdown reads "10 min" for as long as the
# three surfaces take to read, where one in seconds would tick between them.
RETRY_S = 600.0
LABELLED = ModelConfig(name=MODEL, profiles=[ProfileConfig(engine="llamacpp", labels={"pool": "p-x"})])


@attrs.frozen
class Plane:
    inventory: Inventory
    # Where agents dial.
    port: int
    admin: str
    gateway: str

    async def ctl(self, *args: str) -> str:
        # In a thread: ctl runs its own event loop, and the admin API runs on this one.
        result = await asyncio.to_thread(
            CliRunner().invoke, ctl, ["--server", self.admin, *args], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return result.stdout

    async def chat(self) -> tuple[int, Any]:
        """The status and body a chat request for MODEL gets."""
        url = f"{self.gateway}/v1/chat/completions"
        async with aiohttp.ClientSession() as session, session.post(url, json=CHAT) as reply:
            return reply.status, await reply.json()

    async def refusal(self) -> str:
        """The message of the 503 a chat request for MODEL gets."""
        status, body = await self.chat()
        assert status == 503, body
        message: str = body["error"]["message"]
        return message

    async def page(self) -> str:
        async with aiohttp.ClientSession() as session, session.get(f"{self.admin}/models") as reply:
            return html.unescape(await reply.text())

    async def surfaces(self) -> tuple[str, str, str]:
        """The 503's message, `ctl models` output and the models page, for MODEL."""
        return await self.refusal(), await self.ctl("models"), await self.page()


def said_everywhere(surfaces: tuple[str, str, str], sentence: str) -> None:
    message, ctl_models, page = surfaces
    assert message == f"{MODEL} has no ready replica: {sentence}", message
    assert f"{MODEL} has no ready replica: {sentence}" in ctl_models, ctl_models
    assert f"{MODEL} has no ready replica: {sentence}" in page


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@contextlib.asynccontextmanager
async def control_plane(cfg: ServerConfig, store: Store) -> AsyncIterator[Plane]:
    """What the server role runs for this, in this process, on loopback."""
    inventory = Inventory(grace_s=cfg.control.grace_s)
    catalog = Catalog(cfg)
    reconciler = Reconciler(cfg, inventory, catalog, in_flight={})
    admin_app = make_admin_app(cfg, inventory, catalog, WebContext(cfg=cfg, store=store))
    admin_app[adminapi.BACKOFF_KEY] = reconciler.backoff
    async with (
        serve_agents(cfg, inventory) as port,
        asyncio.TaskGroup() as tasks,
        TestServer(admin_app, host="127.0.0.1") as admin,
        TestServer(make_gateway_app(cfg, catalog, inventory, KeyCache()), host="127.0.0.1") as gateway,
    ):
        running = [
            tasks.create_task(reconciler.run()),
            tasks.create_task(EngineChecks(inventory, cfg.control.engine_check_s).run()),
        ]
        try:
            yield Plane(
                inventory, port, str(admin.make_url("")).rstrip("/"), str(gateway.make_url("")).rstrip("/")
            )
        finally:
            for task in running:
                task.cancel()


def plane_cfg(server_cfg: ServerConfig, model: ModelConfig, **control: float) -> ServerConfig:
    """The plane's configuration serving model alone, wanting llamacpp b1 installed on every node."""
    return config.evolve(
        server_cfg,
        auth=AuthConfig(enabled=False),
        models=[model],
        engines={"llamacpp": "b1"},
        control=config.evolve(server_cfg.control, **control),
    )


@pytest.fixture(scope="module")
def tls(fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TLSConfig]:
    """Certificates for n-x and n-y from the fleet's authority: the fleet fixture has only n1's and n2's."""
    ca, out = Path(fleet.server.ca).parent, tmp_path_factory.mktemp("certs")
    issued = {}
    for node_id in ("n-x", "n-y"):
        cert, key = pki.issue_agent(ca, node_id, out)
        issued[node_id] = TLSConfig(ca=fleet.server.ca, cert=str(cert), key=str(key))
    return issued


@contextlib.asynccontextmanager
async def publishing(fake: FakeRelease) -> AsyncIterator[ReleaseClient]:
    """A release host on loopback serving fake, and a client of it."""
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        async with ReleaseClient(api_url=fake.url, download_url=fake.url) as client:
            yield client
    finally:
        for held in (fake.hold_downloads, fake.pause):
            if held is not None:
                held.set()
        await runner.cleanup()


class NoShards:
    """The supervisor of a node that is only installing: nothing is placed on it."""

    def __init__(self) -> None:
        self.on_status: Any = None

    def advertise(self, address: str) -> None:
        pass

    async def start(self, req: Any) -> None:
        raise AssertionError("nothing should be started")

    async def stop(self, shard_id: str) -> None:
        pass

    def statuses(self) -> list[Any]:
        return []

    def output(self, shard_id: str) -> list[str]:
        return []

    def sources(self) -> list[str]:
        return []


@contextlib.asynccontextmanager
async def installing_node(
    node_id: str,
    labels: Mapping[str, str],
    tls: TLSConfig,
    port: int,
    tmp_path: Path,
    releases: ReleaseClient,
) -> AsyncIterator[ProvisionLoop]:
    """An agent whose provision loop installs what the control plane wants from releases' host."""
    cfg = AgentConfig(
        node_id=node_id,
        servers=[f"127.0.0.1:{port}"],
        tls=tls,
        labels=dict(labels),
        heartbeat_interval_s=0.05,
        state_dir=str(tmp_path / node_id / "agent"),
        provision=ProvisionConfig(dir=str(tmp_path / node_id / "engines")),
    )
    loop = ProvisionLoop(
        cfg, UBUNTU, FakeMachine(), releases, lock_retry_s=0.0, first_retry_s=RETRY_S, every_s=RETRY_S
    )
    client = AgentClient(
        cfg, NoShards(), {"sim": "builtin"}, provision=loop, backoff_base_s=0.02, backoff_max_s=0.1
    )
    async with asyncio.TaskGroup() as tasks:
        owned = [tasks.create_task(loop.run()), tasks.create_task(client.run())]
        try:
            yield loop
        finally:
            for task in owned:
                task.cancel()


def failed_with_next_try(plane: Plane, node_id: str) -> bool:
    node = plane.inventory.node(node_id)
    return node is not None and any(p.state == "failed" and p.next_try_s for p in node.provision)


class TestTheNodeWhoseLabelsFit:
    async def test_its_failed_checksum_is_quoted_with_its_next_try_and_the_labels_are_not_blamed(
        self, tls, server_cfg: ServerConfig, store: Store, tmp_path: Path, eventually
    ) -> None:
        """The publisher's checksum is not the archive's: both nodes fail, only n-x's words are said."""
        wrong = "sha256:" + "0" * 64
        fake = FakeRelease()
        fake.digests[CPU_ASSET] = wrong
        got = sha256(fake.assets[CPU_ASSET])
        async with (
            publishing(fake) as releases,
            control_plane(plane_cfg(server_cfg, LABELLED), store) as plane,
            installing_node("n-x", {"pool": "p-x"}, tls["n-x"], plane.port, tmp_path, releases),
            installing_node("n-y", {"pool": "other"}, tls["n-y"], plane.port, tmp_path, releases),
        ):
            await eventually(lambda: failed_with_next_try(plane, "n-x"), within_s=WAIT_S)
            await eventually(lambda: failed_with_next_try(plane, "n-y"), within_s=WAIT_S)
            said_everywhere(
                await plane.surfaces(),
                "only n-x has pool=p-x, and llamacpp b1 failed to install there: "
                f"{CPU_ASSET} does not match the checksum its publisher gave "
                f"(got {got[:12]}, expected {'0' * 12}); it was not installed (next try in 10 min)",
            )

    async def test_a_node_installing_that_the_labels_rule_out_is_not_named(
        self, tls, server_cfg: ServerConfig, store: Store, tmp_path: Path, eventually
    ) -> None:
        """n-x's release host has no release b1; n-y, labelled otherwise, is held mid-download."""
        missing, paused = FakeRelease(), FakeRelease()
        missing.tags = set()
        # Half the archive, so that n-y's download is under way whatever the archive's size: the fake's
        # is 186 bytes, and a pause after 1,024 let n-y install it whole before anyone looked.
        paused.pause_after, paused.pause = len(paused.assets[CPU_ASSET]) // 2, asyncio.Event()
        async with (
            publishing(missing) as nowhere,
            publishing(paused) as slow,
            control_plane(plane_cfg(server_cfg, LABELLED), store) as plane,
            installing_node("n-x", {"pool": "p-x"}, tls["n-x"], plane.port, tmp_path, nowhere),
            installing_node("n-y", {"pool": "other"}, tls["n-y"], plane.port, tmp_path, slow),
        ):
            await eventually(lambda: failed_with_next_try(plane, "n-x"), within_s=WAIT_S)

            def n_y_downloading() -> bool:
                # Looked up each time: n-y may not have registered yet when n-x has already failed.
                n_y = plane.inventory.node("n-y")
                return (
                    n_y is not None
                    and [p.state for p in n_y.provision] == ["installing"]
                    and n_y.provision[0].detail.startswith(f"downloading {CPU_ASSET}")
                )

            await eventually(n_y_downloading, within_s=WAIT_S)
            surfaces = await plane.surfaces()
            said_everywhere(
                surfaces,
                "only n-x has pool=p-x, and llamacpp b1 failed to install there: "
                "ggml-org/llama.cpp has no release b1 (next try in 10 min)",
            )
            message, ctl_models, _ = surfaces
            assert "n-y" not in message and "n-y" not in ctl_models


SIM = ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])
# The sim listening on a port of its own choosing: alive, saying where it serves, and never answering
# /health where the supervisor asks.
DEAF = ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim", args=["--port", "0"])])
READY_TIMEOUT_S = 5.0


@contextlib.asynccontextmanager
async def sim_node(
    fleet: Any, port: int, tmp_path: Path, ready_timeout_s: float = WAIT_S
) -> AsyncIterator[tuple[Supervisor, asyncio.Task[None]]]:
    """Node n1: its agent client and a supervisor running the sim engine; the client's task is the agent.

    Cancelling that task stops the agent and leaves its engines serving, as a clean stop does.
    """
    cfg = AgentConfig(
        node_id="n1",
        servers=[f"127.0.0.1:{port}"],
        state_dir=str(tmp_path / "agent"),
        tls=fleet.agents["n1"],
        heartbeat_interval_s=0.1,
        probe=ProbeConfig(interval_s=3600, progress_s=0),
    )
    async with (
        Supervisor(
            ENGINES,
            ready_timeout_s=ready_timeout_s,
            state_dir=tmp_path / "agent",
            probe=cfg.probe,
            node=cfg.node_id,
        ) as supervisor,
        asyncio.TaskGroup() as tasks,
    ):
        client = AgentClient(cfg, supervisor, {"sim": "builtin"}, backoff_base_s=0.05, backoff_max_s=0.2)
        agent = tasks.create_task(client.run())
        try:
            yield supervisor, agent
        finally:
            agent.cancel()


def numbers_as_n(text: str) -> str:
    """text with its ages ("for 3 s") as "for N s": each surface is read a moment after the last."""
    return re.sub(r"\bfor \d+ s\b", "for N s", text)


class TestAReplicaWhoseAgentStopped:
    async def test_reads_its_agent_unreachable_while_its_engine_answers_then_not_routed(
        self, fleet, server_cfg: ServerConfig, store: Store, tmp_path: Path, eventually
    ) -> None:
        cfg = plane_cfg(server_cfg, SIM, grace_s=1.0, engine_check_s=0.2)
        async with control_plane(cfg, store) as plane, sim_node(fleet, plane.port, tmp_path) as (sup, agent):
            inventory = plane.inventory
            await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
            [replica] = inventory.replicas(MODEL)
            agent.cancel()
            node = inventory.node("n1")
            assert node is not None
            await eventually(lambda: node.state == UNREACHABLE, within_s=WAIT_S)

            away = "ready; its node's agent unreachable for N s"
            replicas, page = await plane.ctl("replicas"), await plane.page()
            assert away in numbers_as_n(replicas), replicas
            assert away in numbers_as_n(page)
            assert f"{replica.shard_id} on n1 {away}" in numbers_as_n(await plane.ctl("models"))
            status, _ = await plane.chat()
            assert status == 200

            # Now the engine stops answering too: the gateway's own check takes it out of routing.
            [status] = sup.statuses()
            os.kill(status.pid, signal.SIGSTOP)
            try:
                await eventually(lambda: not inventory.ready_endpoints(MODEL), within_s=WAIT_S)
                passed_by = "ready (node unreachable for N s; not routed)"
                replicas, page = await plane.ctl("replicas"), await plane.page()
                assert passed_by in numbers_as_n(replicas), replicas
                assert passed_by in numbers_as_n(page)
                said_everywhere(await plane.surfaces(), "ready on n1, which is unreachable")
            finally:
                os.kill(status.pid, signal.SIGCONT)


class TestAReplicaStartingAgainAfterAFailure:
    async def test_says_its_try_and_the_last_ones_words_on_every_surface(
        self, fleet, server_cfg: ServerConfig, store: Store, tmp_path: Path, eventually
    ) -> None:
        cfg = plane_cfg(server_cfg, DEAF)
        async with (
            control_plane(cfg, store) as plane,
            sim_node(fleet, plane.port, tmp_path, ready_timeout_s=READY_TIMEOUT_S),
        ):
            inventory = plane.inventory

            def retrying() -> bool:
                return any(
                    r.state == "starting" and inventory.failures.retrying(MODEL, "n1")
                    for r in inventory.replicas(MODEL)
                )

            await eventually(retrying, within_s=WAIT_S + 2 * READY_TIMEOUT_S)
            surfaces = await plane.surfaces()
            replicas = await plane.ctl("replicas")
            last = inventory.failures.last(MODEL, "n1")
            assert last is not None
            assert last.reason.startswith("sim did not answer /health within 5 s"), last.reason
            tried = f"(try 2; the last {last.reason.removeprefix('sim ')})"
            message, ctl_models, page = (numbers_as_n(surface) for surface in surfaces)
            said_everywhere((message, ctl_models, page), f"starting on n1 for N s {tried}")
            assert f"starting {tried}" in replicas, replicas
            assert f"starting {tried}" in surfaces[2]
