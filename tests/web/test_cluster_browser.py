"""The cluster and node-logs pages in a real headless Chromium, with a live server and agent on loopback.

Screenshots are saved under the test's temporary directory (cluster.png, logs.png), for a person to look at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from playwright.async_api import async_playwright, expect

from llmgw import pki
from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.config import AgentConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig, TLSConfig
from llmgw.engines.registry import ENGINES
from llmgw.log import RING
from llmgw.roles.server import ServerHandle, server_role
from tests import needs


@attrs.frozen
class Live:
    server: ServerHandle
    client: AgentClient


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    pki_dir = tmp_path / "pki"
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1", "localhost"], pki_dir)
    pki.issue_agent(pki_dir, "node-1", pki_dir)
    (tmp_path / "server").mkdir()
    return pki_dir


@pytest.fixture
async def live(tmp_path: Path, pki_dir: Path) -> AsyncIterator[Live]:
    ca = str(pki_dir / "ca.pem")
    server_cfg = ServerConfig(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        agent_listen="127.0.0.1:0",
        state_dir=str(tmp_path / "server"),
        tls=TLSConfig(ca=ca, cert=str(pki_dir / "server.pem"), key=str(pki_dir / "server-key.pem")),
        control=ControlConfig(interval_s=0.2),
        models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])],
        # Nothing to install: this machine cannot reach GitHub, and the sim ships inside llmgw.
        engines={"llamacpp": ""},
    )
    async with server_role(server_cfg) as server:
        agent_cfg = AgentConfig(
            node_id="node-1",
            servers=[f"127.0.0.1:{server.agent_port}"],
            heartbeat_interval_s=0.2,
            tls=TLSConfig(ca=ca, cert=str(pki_dir / "node-1.pem"), key=str(pki_dir / "node-1-key.pem")),
        )
        # The agent's stream and a real supervisor running the real sim engine: what the pages show
        # of a node. (Without the agent role's discovery and installs, which have their own tests.)
        async with (
            Supervisor(ENGINES, ready_timeout_s=30.0, state_dir=tmp_path / "agent") as supervisor,
            asyncio.TaskGroup() as tasks,
        ):
            client = AgentClient(agent_cfg, supervisor, {"sim": "builtin"}, backoff_base_s=0.05)
            stream = tasks.create_task(client.run())
            await asyncio.wait_for(client.connected.wait(), 10)
            yield Live(server=server, client=client)
            stream.cancel()


async def test_the_cluster_and_logs_pages_show_a_live_node_in_chromium(live: Live, tmp_path: Path):
    inventory = live.server.inventory
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=needs.program("chromium", "chromium"),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 700})
            # Wait for the node to register and its sim replica to be ready, as a person would: reloading.
            await page.goto(f"{live.server.admin_url}/models")
            await expect(page.locator("td.state-ready")).to_have_count(1, timeout=30_000)
            # Each model, its replicas, where they run, and their state.
            replica_row = page.locator("#model-sim-chat tbody tr")
            await expect(replica_row).to_contain_text("node-1")
            await expect(replica_row.locator("td.state")).to_have_text("ready")
            await page.screenshot(path=str(tmp_path / "models.png"), full_page=True)
            # What the agent's log would hold: enough lines to scroll, the newest with markup in it.
            # Only now: the agent logs the replica's "ready" when it gets there, after any line added sooner.
            for i in range(300):
                RING.append(f"line {i} of the agent's log")
            RING.append("a line with markup: <b>not bold</b>")

            await page.goto(f"{live.server.admin_url}/")
            row = page.locator("#node-node-1")
            await expect(row).to_contain_text("ready")
            await expect(row).to_contain_text("sim")
            await expect(row).to_contain_text("sim-chat")
            await page.screenshot(path=str(tmp_path / "cluster.png"), full_page=True)

            await row.get_by_role("link", name="logs").click()
            await page.wait_for_url("**/nodes/node-1/logs")
            log = page.locator("#log")
            # Escaped: the markup is text on the page, and no <b> element exists inside the log.
            await expect(log).to_contain_text("a line with markup: <b>not bold</b>")
            assert await log.locator("b").count() == 0
            tabs = page.locator("nav.tabs a")
            (replica,) = inventory.replicas("sim-chat")
            await expect(tabs).to_have_text(["agent", replica.shard_id])
            # The newest line is at the bottom, and the page is scrolled to it.
            at_bottom = await page.evaluate(
                "() => window.scrollY + window.innerHeight >= document.documentElement.scrollHeight - 2"
            )
            assert at_bottom
            # Oldest first, newest last: the page's lines are the ring's newest, in the ring's order.
            # (The live server and agent may log after the page was made, so compare with the ring now.)
            shown = (await log.inner_text()).rstrip("\n").splitlines()
            ring = RING.tail()
            start = ring.index(shown[0])
            assert ring[start : start + len(shown)] == shown
            newest = shown.index("a line with markup: <b>not bold</b>")
            assert newest > shown.index("line 299 of the agent's log")
            await page.screenshot(path=str(tmp_path / "logs.png"), full_page=False)

            await tabs.nth(1).click()
            await expect(page.locator("h1")).to_contain_text(replica.shard_id)
            await page.get_by_role("link", name="1000").click()
            await page.get_by_role("link", name="follow").click()
            assert "follow=1" in page.url and "lines=1000" in page.url
            await page.screenshot(path=str(tmp_path / "engine-logs.png"), full_page=False)
        finally:
            await browser.close()
    assert (tmp_path / "cluster.png").stat().st_size > 0
    assert (tmp_path / "logs.png").stat().st_size > 0
