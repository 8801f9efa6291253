"""The cluster, models and node-logs pages, on the admin listener and under /admin on the client port."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from llmgw.adminapi import auth, views
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.scaling import SCALER_KEY
from llmgw.agent.discovery.host import Host
from llmgw.bench.result import Level, Run
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ScaleConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.placement import Backoff
from llmgw.control.scaling import Scaler
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.history import History
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store, open_store
from llmgw.store.scopes import DEFAULT_PROJECT_ID
from llmgw.store.users import create_user
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.client_port import mount_client_port
from llmgw.web.context import WebContext
from llmgw.web.history import HISTORY_KEY

from .conftest import nav_links

PASSWORD = "correct horse battery"
CFG = ServerConfig(
    admin_listen="127.0.0.1:0",
    models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])],
    admin_tokens=[auth.hash_token("s3cret")],
)
AGENT_LINES = [
    "registered with the control plane",
    "installed an engine <b>llamacpp</b> & <script>x()</script>",
]


@attrs.define
class Sites:
    inventory: Inventory
    admin: str
    client: str


async def answer_logs(inventory: Inventory, node_id: str) -> None:
    link = inventory._links[node_id]
    while True:
        request = (await link.outbox.get()).logs
        if request.request_id:
            inventory.logs.resolve(
                node_id,
                pb.LogsReply(
                    request_id=request.request_id, lines=AGENT_LINES, sources=["agent", "sim-chat-1"]
                ),
            )


@pytest.fixture
async def cluster_store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@pytest.fixture
async def sites(cluster_store: Store) -> AsyncIterator[Sites]:
    inventory = Inventory(5.0)
    inventory.attach(
        pb.Register(
            node_id="n1",
            agent_version="0.11.2",
            engine_versions={"sim": "builtin"},
            engines_probed=True,
            gpus=[pb.Gpu(index=0, name="L4", gpu_class="l4-24g", healthy=False, unhealthy_reason="XID 79")],
        )
    )
    inventory.attach(pb.Register(node_id="n2"))
    pages = WebContext(cfg=CFG, store=cluster_store)
    # One catalog, as the server role has: the admin listener's API changes what the gateway serves.
    catalog = Catalog(CFG)
    gateway = make_gateway_app(CFG, catalog, inventory, KeyCache())
    mount_client_port(gateway, CFG, inventory, catalog, pages)
    answering = asyncio.create_task(answer_logs(inventory, "n1"))
    async with (
        TestServer(make_admin_app(CFG, inventory, catalog, pages), host="127.0.0.1") as admin,
        TestServer(gateway, host="127.0.0.1") as client,
    ):
        yield Sites(
            inventory,
            str(admin.make_url("")).rstrip("/"),
            str(client.make_url("")).rstrip("/"),
        )
    answering.cancel()


async def get(url: str, **kwargs: object) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, allow_redirects=False, **kwargs) as reply:  # type: ignore[arg-type]
        return reply.status, await reply.text()


class TestOnTheAdminListener:
    async def test_the_cluster_page_shows_a_dash_where_nothing_was_reported_never_a_zero(self, sites: Sites):
        status, html = await get(f"{sites.admin}/")
        assert status == 200
        row = html[html.index('id="node-n2"') : html.index("</tr>", html.index('id="node-n2"'))]
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        # gpus, ram, disk: never reported by n2.
        assert cells[3:6] == ["—", "—", "—"]
        assert "none yet" in cells[6]
        assert "GPU 0 (L4): XID 79" in html
        assert 'href="/nodes/n1/logs"' in html

    async def test_the_cluster_page_shows_each_nodes_agent_version_and_unknown_for_one_that_did_not_say(
        self, sites: Sites
    ):
        _, html = await get(f"{sites.admin}/")
        versions = {}
        for node in ("n1", "n2"):
            row = html[html.index(f'id="node-{node}"') : html.index("</tr>", html.index(f'id="node-{node}"'))]
            versions[node] = re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[2])
        assert versions == {"n1": "0.11.2", "n2": "unknown"}

    async def test_a_node_still_installing_gets_a_row_per_install_warning_and_sick_gpu_beneath_it(
        self, sites: Sites
    ):
        host = Host(os_id="debian", os_version="12", os_codename="bookworm", arch="amd64", cpu_flags=("avx",))
        sites.inventory.attach(
            pb.Register(
                node_id="n3",
                engine_versions={"sim": "builtin"},
                engines_probed=True,
                host=host.to_proto(),
                warnings=host.warnings(),
                provision=[
                    pb.ProvisionStatus(
                        engine="llamacpp",
                        version="b6500",
                        variant="cuda",
                        state="installing",
                        detail="downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB)",
                    ),
                    pb.ProvisionStatus(engine="sglang", state="ready", detail="sglang 0.5"),
                ],
                gpus=[pb.Gpu(index=0, name="A10", healthy=False, unhealthy_reason="ECC errors")],
            )
        )
        _, html = await get(f"{sites.admin}/")
        start = html.index('id="node-n3"')
        node_row = html[start : html.index("</tr>", start)]
        assert "debian 12 (bookworm) amd64" in node_row
        cells = re.findall(r"<td[^>]*>(.*?)</td>", node_row, re.S)
        assert cells[6] == "sim"  # Engines: what runs, not what is still on its way
        beneath = re.findall(r'<tr class="node-note">.*?<td[^>]*class="(\w+)">(.*?)</td>', html[start:], re.S)
        assert beneath == [
            (
                "note",
                "llamacpp b6500 (cuda) installing: downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB)",
            ),
            ("bad", "no AVX2: inference runs several times slower (a VM needs CPU type &#34;host&#34;)"),
            ("bad", "GPU 0 (A10): ECC errors"),
        ]

    async def test_a_log_line_with_markup_is_shown_escaped(self, sites: Sites):
        status, html = await get(f"{sites.admin}/nodes/n1/logs?source=agent&lines=100")
        assert status == 200
        assert (
            "installed an engine &lt;b&gt;llamacpp&lt;/b&gt; &amp; &lt;script&gt;x()&lt;/script&gt;" in html
        )
        assert "<b>llamacpp" not in html and "<script>x()" not in html

    async def test_the_logs_page_has_a_tab_per_source_and_the_line_counts(self, sites: Sites):
        _, html = await get(f"{sites.admin}/nodes/n1/logs?lines=300")
        assert 'href="/nodes/n1/logs?source=sim-chat-1&amp;lines=300"' in html
        for count in (100, 300, 1000, 2000):
            assert f"lines={count}" in html
        assert "follow=1" in html

    async def test_following_refreshes_every_five_seconds(self, sites: Sites):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{sites.admin}/nodes/n1/logs?follow=1") as reply,
        ):
            assert reply.headers["Refresh"] == "5"

    async def test_a_node_that_is_not_connected_is_said_so_on_its_logs_page(self, sites: Sites):
        sites.inventory.detach(sites.inventory._links["n2"])
        _, html = await get(f"{sites.admin}/nodes/n2/logs")
        assert "node n2 is not connected" in html

    async def test_the_models_page_lists_each_model(self, sites: Sites):
        status, html = await get(f"{sites.admin}/models")
        assert status == 200 and "sim-chat" in html

    async def test_a_change_that_is_not_json_is_refused_so_another_site_cannot_make_it(self, sites: Sites):
        async with aiohttp.ClientSession() as session:
            for path in ("/api/v1/nodes/n1/state", "/api/v1/weights/collect"):
                async with session.post(f"{sites.admin}{path}", data={"state": "cordoned"}) as reply:
                    assert reply.status == 415, path
        node = sites.inventory.node("n1")
        assert node is not None and node.admin_state == "ready"

    async def test_every_link_on_its_pages_leads_somewhere_and_none_offers_a_log_in(self, sites: Sites):
        """The listener has no accounts: a "Log in" or profile link there would be a 404."""
        for page in ("/", "/models", "/nodes/n1/logs"):
            _, html = await get(f"{sites.admin}{page}")
            assert "Log in" not in html, page
            for href in set(re.findall(r'href="(/[^"]*)"', html)):
                status, _ = await get(f"{sites.admin}{href.replace('&amp;', '&')}")
                assert status == 200, (page, href)

    async def test_a_request_naming_another_host_is_refused(self, sites: Sites):
        status, body = await get(f"{sites.admin}/api/v1/nodes", headers={"Host": "evil.example"})
        assert status == 421 and "this machine's own names" in body


class TestOnTheClientPort:
    async def test_the_pages_need_an_administrators_session(self, sites: Sites, cluster_store: Store):
        status, _ = await get(f"{sites.client}/admin/cluster")
        assert status == 303
        await create_user(
            cluster_store,
            "root@example.com",
            PASSWORD,
            status="active",
            is_admin=True,
            project_id=DEFAULT_PROJECT_ID,
        )  # type: ignore[call-arg]
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(base_url=sites.client, cookie_jar=jar) as browser:
            login = await (await browser.get("/login")).text()
            csrf = re.search(r'name="csrf" value="([^"]+)"', login)
            assert csrf is not None
            await browser.post(
                "/login", data={"email": "root@example.com", "password": PASSWORD, "csrf": csrf[1]}
            )
            page = await browser.get("/admin/cluster")
            assert page.status == 200 and 'href="/admin/nodes/n1/logs"' in await page.text()
            assert await nav_links(browser, "/admin/cluster") == [
                ("/profile", "Profile"),
                ("/admin/users", "Users"),
                ("/admin/projects", "Projects"),
                ("/admin/quotas", "Quotas"),
                ("/admin/usage", "Usage"),
                ("/admin/cluster", "Cluster"),
                ("/admin/models", "Models"),
            ]
            logs = await browser.get("/admin/nodes/n1/logs")
            assert "&lt;b&gt;llmgw" not in await logs.text() and "&lt;b&gt;llamacpp" in await logs.text()
            # No mirror: its page says so in HTML, as the document says (it was the gateway's JSON 404).
            mirror = await browser.get("/admin/mirror")
            assert (mirror.status, mirror.content_type) == (404, "text/html")
            assert "No mirror is configured" in await mirror.text()

    async def test_a_page_asked_with_an_admin_token_is_refused_in_words_not_sent_to_sign_in(
        self, sites: Sites
    ):
        """The token was not a session: a 303 to /login, and a script following it got the form with a 200."""
        for path in ("/admin/nodes/n1/logs", "/admin/cluster", "/admin/users"):
            status, text = await get(f"{sites.client}{path}", headers={"Authorization": "Bearer s3cret"})
            assert status == 401, path
            assert "a token (the Authorization header) does not sign in" in text
            assert "/admin/api/v1/openapi.json" in text

    async def test_an_administrators_session_reaches_every_api_route_and_changes_with_its_csrf_token(
        self, sites: Sites, cluster_store: Store
    ):
        await create_user(
            cluster_store,
            "root@example.com",
            PASSWORD,
            status="active",
            is_admin=True,
            project_id=DEFAULT_PROJECT_ID,
        )  # type: ignore[call-arg]
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(base_url=sites.client, cookie_jar=jar) as browser:
            login = await (await browser.get("/login")).text()
            csrf = re.search(r'name="csrf" value="([^"]+)"', login)
            assert csrf is not None
            await browser.post(
                "/login", data={"email": "root@example.com", "password": PASSWORD, "csrf": csrf[1]}
            )
            for path in (
                "status",
                "nodes",
                "nodes/n1/logs?source=agent&lines=10",
                "models",
                "replicas",
                "explain-placement?model=sim-chat",
                "openapi.json",
                "orgs",
                "projects/default/members",
                "quotas",
                "prices",
            ):
                async with browser.get(f"/admin/api/v1/{path}") as reply:
                    assert reply.status == 200, path
            # The session's own token, as its pages carry it in every form.
            page = await (await browser.get("/admin/cluster")).text()
            token = re.search(r'name="csrf" value="([^"]+)"', page)
            assert token is not None
            cordon = {"state": "cordoned"}
            async with browser.post("/admin/api/v1/nodes/n1/state", json=cordon) as reply:
                assert reply.status == 401 and "X-CSRF-Token" in await reply.text()
            async with browser.post(
                "/admin/api/v1/nodes/n1/state", json=cordon, headers={"X-CSRF-Token": "forged"}
            ) as reply:
                assert reply.status == 401
            node = sites.inventory.node("n1")
            assert node is not None and node.admin_state == "ready"
            async with browser.post(
                "/admin/api/v1/nodes/n1/state", json=cordon, headers={"X-CSRF-Token": token[1]}
            ) as reply:
                assert reply.status == 200, await reply.text()
            assert node.admin_state == "cordoned"

    async def test_the_api_needs_an_admin_token(self, sites: Sites):
        status, body = await get(f"{sites.client}/admin/api/v1/nodes")
        assert status == 401 and "admin token" in body
        status, _ = await get(
            f"{sites.client}/admin/api/v1/nodes", headers={"Authorization": "Bearer s3cret"}
        )
        assert status == 200


async def test_every_page_and_api_route_of_the_admin_listener_is_in_the_openapi_document(
    cluster_store: Store,
):
    from openapi_spec_validator import validate

    from llmgw.web.admin_listener import document

    app = make_admin_app(CFG, Inventory(5.0), Catalog(CFG), WebContext(cfg=CFG, store=cluster_store))
    doc = document("test")
    validate(doc)  # type: ignore[arg-type]
    listed = {(path, method.upper()) for path, item in doc["paths"].items() for method in item}
    served = {
        (route.resource.canonical, route.method)
        for route in app.router.routes()
        # Stylesheets and the page's script are files, not part of the API.
        if route.resource is not None
        and route.method != "HEAD"
        and not route.resource.canonical.startswith("/static")
    }
    assert served - listed == set()


class TestTheEngineSecret:
    async def test_a_replicas_secret_is_on_no_page_and_in_no_admin_api_answer(self, sites: Sites):
        secret = "engine-secret-that-must-stay-hidden"
        with capture_logs() as logs:
            sites.inventory.attach(
                pb.Register(
                    node_id="n4",
                    engine_versions={"sim": "builtin"},
                    engines_probed=True,
                    running=[
                        pb.ShardStatus(
                            shard_id="sim-chat-9f",
                            model="sim-chat",
                            engine="sim",
                            state="ready",
                            endpoint="http://10.0.0.24:20001",
                            engine_secret=secret,
                        )
                    ],
                )
            )
        assert sites.inventory.engine_secret("sim-chat-9f") == secret
        assert secret not in repr(logs)
        for path in (
            "/",
            "/models",
            "/api/v1/status",
            "/api/v1/nodes",
            "/api/v1/models",
            "/api/v1/replicas",
            "/api/v1/explain-placement?model=sim-chat",
        ):
            status, body = await get(f"{sites.admin}{path}")
            assert status == 200, path
            assert secret not in body, path
        # The replica is there, so its absence is not for want of showing it.
        assert "http://10.0.0.24:20001" in (await get(f"{sites.admin}/api/v1/replicas"))[1]


class TestFailuresAndRefusals:
    """What failed and who was refused, on the cluster and models pages, escaped like every cell."""

    CAUSE = "llamacpp exited with code 1: error: <b>failed</b> to load model"

    def _fail(self, inventory: Inventory) -> None:
        failed = pb.ShardStatus(
            shard_id="sim-chat-dead", model="sim-chat", engine="sim", state="failed", detail=self.CAUSE
        )
        inventory.shard_status("n1", failed)
        inventory.forget("sim-chat-dead")

    async def test_the_cluster_page_lists_refused_connections_by_address_and_reason(self, sites: Sites):
        for port in (40001, 40002, 40003):
            sites.inventory.refused.refuse(f"198.18.0.7:{port}", "no certificate presented")
        status, html = await get(f"{sites.admin}/")
        assert status == 200
        assert "3 refused connections from 198.18.0.7 in the last hour: no certificate presented" in html

    async def test_the_cluster_page_lists_recent_failures_with_a_link_to_the_engines_output(
        self, sites: Sites
    ):
        self._fail(sites.inventory)
        status, html = await get(f"{sites.admin}/")
        assert status == 200
        assert "llamacpp exited with code 1: error: &lt;b&gt;failed&lt;/b&gt; to load model" in html
        assert 'href="/nodes/n1/logs?source=sim-chat-dead"' in html

    async def test_the_models_page_shows_why_and_the_failures_of_each_model(self, sites: Sites):
        self._fail(sites.inventory)
        status, html = await get(f"{sites.admin}/models")
        assert status == 200
        section = html[html.index('id="model-sim-chat"') :]
        assert "Failed lately" in section
        assert "<code>sim-chat-dead</code>" in section
        assert "error: &lt;b&gt;failed&lt;/b&gt; to load model" in section

    async def test_pages_without_failures_or_refusals_say_nothing_of_them(self, sites: Sites):
        _, html = await get(f"{sites.admin}/")
        assert "Refused connections" not in html and "Failed lately" not in html

    async def test_the_cluster_page_shows_each_node_backing_off_with_why(self, cluster_store: Store):
        inventory = Inventory(5.0)
        app = make_admin_app(CFG, inventory, Catalog(CFG), WebContext(cfg=CFG, store=cluster_store))
        cause = "llamacpp exited with code 1: error: failed to load model"
        app[adminapi.BACKOFF_KEY] = lambda: {
            ("sim-chat", "n1"): Backoff(failures=2, remaining_s=10.0, cause=cause)
        }
        async with TestServer(app, host="127.0.0.1") as server:
            status, html = await get(str(server.make_url("/")))
        assert status == 200
        assert (
            '<code>sim-chat</code>: <span class="bad">node n1 is backing off after 2 failures '
            f"(next try in 10 s): {cause}</span>"
        ) in html


class TestAFleetOfHundreds:
    """The cluster page draws a hundred nodes at a time: all of 10,000 held the gateway's loop for seconds."""

    @pytest.fixture
    async def fleet_site(self, cluster_store: Store) -> AsyncIterator[str]:
        inventory = Inventory(5.0)
        for i in range(250):
            gpus = [pb.Gpu(index=0, name="L4", gpu_class="l4-24g", memory_total_mb=24_000, healthy=True)]
            inventory.attach(pb.Register(node_id=f"n{i:03d}", gpus=gpus))
        catalog = Catalog(CFG)
        app = make_admin_app(CFG, inventory, catalog, WebContext(cfg=CFG, store=cluster_store))
        history = History(GatewayMetrics(CollectorRegistry(), catalog), inventory, window_s=3600)
        history.sample()
        app[HISTORY_KEY] = history
        async with TestServer(app, host="127.0.0.1") as server:
            yield str(server.make_url("")).rstrip("/")

    async def test_each_page_shows_a_hundred_nodes_their_gpu_charts_and_links_to_its_neighbours(
        self, fleet_site: str
    ):
        status, first = await get(f"{fleet_site}/")
        assert status == 200
        assert re.findall(r'id="node-(n\d+)"', first) == [f"n{i:03d}" for i in range(100)]
        assert "Nodes 1–100 of 250" in first
        assert 'href="/?page=2" rel="next"' in first and 'rel="prev"' not in first
        assert "GPU memory, n099" in first and "GPU memory, n100" not in first
        status, last = await get(f"{fleet_site}/?page=3")
        assert status == 200
        assert re.findall(r'id="node-(n\d+)"', last) == [f"n{i:03d}" for i in range(200, 250)]
        assert "Nodes 201–250 of 250" in last
        assert 'href="/?page=2" rel="prev"' in last and 'rel="next"' not in last
        assert "GPU memory, n200" in last and "GPU memory, n199" not in last
        # The summary still counts every node, not only the page's.
        assert "250 nodes (250 ready)" in last

    @pytest.mark.parametrize(
        ("page", "why"),
        [
            ("4", "there is no page 4: the nodes fill 3 pages of 100."),
            ("0", "there is no page 0: the nodes fill 3 pages of 100."),
            ("two", "page is &#39;two&#39;; expected a page number from 1 to 3."),
        ],
    )
    async def test_a_page_the_nodes_do_not_fill_is_refused_in_words(
        self, fleet_site: str, page: str, why: str
    ):
        status, html = await get(f"{fleet_site}/?page={page}")
        assert status == 400
        assert why in html


async def test_a_replica_served_while_its_nodes_agent_is_away_says_so_on_the_models_and_cluster_pages(
    cluster_store: Store,
) -> None:
    now = [100.0]
    inventory = Inventory(5.0, clock=lambda: now[0])
    status = pb.ShardStatus(
        shard_id="sim-chat-1", model="sim-chat", engine="sim", state="ready", endpoint="http://127.0.0.1:9"
    )
    inventory.attach(pb.Register(node_id="n1", running=[status]))
    now[0] += 40
    inventory.expire()
    app = make_admin_app(CFG, inventory, Catalog(CFG), WebContext(cfg=CFG, store=cluster_store))
    async with TestServer(app, host="127.0.0.1") as server:
        base = str(server.make_url("")).rstrip("/")
        _, models = await get(f"{base}/models")
        _, cluster = await get(f"{base}/")
    assert "ready; its node&#39;s agent unreachable for 40 s" in models
    assert "1 of 1 replicas ready (1 whose node&#39;s agent is unreachable)" in cluster


class TestBenchRunsOnTheModelsPage:
    """The runs of `ctl bench` the server keeps, drawn per model on the models page."""

    @staticmethod
    def a_run(model: str) -> dict[str, object]:
        def level(concurrency: int, ttft_ms: float, tokens_per_s: float) -> Level:
            return Level(
                concurrency=concurrency,
                requests=10,
                errors=0,
                error="",
                seconds=2.0,
                output_tokens=int(tokens_per_s * 2),
                ttft_p50_ms=ttft_ms,
                ttft_p95_ms=ttft_ms * 2,
                itl_p50_ms=5.0,
                output_tokens_per_s=tokens_per_s,
                requests_per_s=5.0,
                queue_depth_max=None,
                kv_cache_max=0.0006,
                engine_readings=1,
                input_tokens=10 * 40,
                tpot_p50_ms=ttft_ms / 10,
            )

        run = Run(
            model=model,
            started_at="2025-06-01T12:00:00Z",
            prompt_tokens=32,
            max_tokens=16,
            seconds=2.0,
            levels=[level(1, 40.0, 90.0), level(4, 120.0, 250.0)],
            engines=["llamacpp"],
        )
        unstructured: dict[str, object] = views.CONVERTER.unstructure(run)
        return unstructured

    async def test_a_model_with_a_kept_run_shows_its_charts_and_one_without_shows_none(
        self, cluster_store: Store, tmp_path: Path
    ):
        cfg = attrs.evolve(
            CFG,
            state_dir=str(tmp_path),
            models=[
                *CFG.models,
                ModelConfig(name="unbenched", replicas=0, profiles=[ProfileConfig(engine="sim")]),
            ],
        )
        catalog = Catalog(cfg)
        app = make_admin_app(cfg, Inventory(5.0), catalog, WebContext(cfg=cfg, store=cluster_store))
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
            base = str(server.make_url("")).rstrip("/")
            async with session.post(
                f"{base}/api/v1/models/sim-chat/bench",
                json=self.a_run("sim-chat"),
                headers={"Authorization": "Bearer s3cret"},
            ) as reply:
                assert reply.status == 201, await reply.text()
            status, html = await get(f"{base}/models")
        assert status == 200
        benched, unbenched = html.split('id="model-unbenched"')
        assert "<svg" in benched and "TTFT, run 2025-06-01T12:00:00Z" in benched
        assert "output tokens/s, run 2025-06-01T12:00:00Z at 4: total 250" in benched
        assert "2025-06-01T12:00:00Z · llamacpp · 32-word prompts (40 input tokens each)" in benched
        assert "TPOT, run 2025-06-01T12:00:00Z at 4: p50 12 ms" in benched
        # A cache at 0.0006 read "0%", as if nothing were cached.
        assert "KV cache at most 0.06%" in benched
        assert "<svg" not in unbenched and "Benchmarks" not in unbenched


async def test_the_models_page_says_an_on_demand_models_scale_and_why(cluster_store: Store) -> None:
    model = ModelConfig(
        name="tiny-chat", profiles=[ProfileConfig(engine="sim")], scale=ScaleConfig(min=0, max=3)
    )
    cfg = ServerConfig(models=[model])
    inventory, catalog = Inventory(5.0), Catalog(cfg)
    scaler = Scaler({})
    scaler.wanted(model, {})
    app = make_admin_app(cfg, inventory, catalog, WebContext(cfg=cfg, store=cluster_store))
    app[SCALER_KEY] = scaler
    async with TestServer(app, host="127.0.0.1") as admin:
        status, html = await get(str(admin.make_url("/models")))
    assert status == 200
    assert "On demand: 0 replicas (min 0, max 3, idle 600 s): tiny-chat starts at its scale.min (0)" in html
