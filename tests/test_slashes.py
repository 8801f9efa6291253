"""A trailing or doubled slash leads where the plain path does, and nowhere else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestServer

from llmgw.bodies import SERVER_OPTIONS
from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import open_store
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.client_port import mount_client_port
from llmgw.web.context import WebContext


@attrs.frozen
class Urls:
    client_port: str
    admin: str


@pytest.fixture
async def urls(tmp_path: Path) -> AsyncIterator[Urls]:
    cfg = ServerConfig(
        models=[ModelConfig(name="sim-chat")], auth=AuthConfig(enabled=False), admin_listen="127.0.0.1:0"
    )
    async with open_store(tmp_path / "llmgw.db") as store:
        catalog, inventory, pages = Catalog(cfg, store), Inventory(5.0), WebContext(cfg=cfg, store=store)
        gateway = make_gateway_app(cfg, catalog, inventory, KeyCache())
        mount_client_port(gateway, cfg, inventory, catalog, pages)
        servers = [
            TestServer(gateway, host="127.0.0.1", port=0),
            TestServer(make_admin_app(cfg, inventory, catalog, pages), host="127.0.0.1", port=0),
        ]
        for server in servers:
            await server.start_server(**SERVER_OPTIONS)
        try:
            yield Urls(*(str(s.make_url("")).rstrip("/") for s in servers))
        finally:
            for server in servers:
                await server.close()


async def _ask(method: str, url: str) -> tuple[int, str, str, object]:
    """(status, Location, Allow, the JSON body or the text)."""
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, allow_redirects=False) as reply,
    ):
        body = await reply.json() if reply.content_type == "application/json" else await reply.text()
        return reply.status, reply.headers.get("Location", ""), reply.headers.get("Allow", ""), body


class TestPlainPaths:
    async def test_a_trailing_or_doubled_slash_is_redirected_to_the_plain_path(self, urls: Urls) -> None:
        assert (await _ask("GET", urls.client_port + "/admin/"))[:2] == (308, "/admin")
        assert (await _ask("GET", urls.client_port + "//v1//models/?x=1"))[:2] == (308, "/v1/models?x=1")
        assert (await _ask("GET", urls.admin + "/models/"))[:2] == (308, "/models")

    async def test_a_method_the_plain_path_does_not_take_is_its_405_not_a_404(self, urls: Urls) -> None:
        """TRACE /admin/ was a 404 while TRACE /admin was a 405."""
        status, _, allow, body = await _ask("TRACE", urls.client_port + "/admin/")
        assert (status, allow) == (405, "GET,HEAD")
        assert isinstance(body, dict) and body["error"]["message"] == "/admin/ does not accept TRACE"
        status, _, allow, body = await _ask("TRACE", urls.admin + "/api/v1/status/")
        assert (status, allow, body) == (405, "GET", {"error": "/api/v1/status/ does not accept TRACE"})

    async def test_a_path_one_letter_past_a_route_is_a_404_not_a_redirect_to_that_route(
        self, urls: Urls
    ) -> None:
        """The path less its last character was tried too, whatever that character was."""
        status, location, _, _ = await _ask("POST", urls.client_port + "/v1/chat/completionsX")
        assert (status, location) == (404, "")
        status, location, _, _ = await _ask("GET", urls.admin + "/modelsX")
        assert (status, location) == (404, "")

    async def test_a_doubled_slash_at_the_start_never_leads_to_another_host(self, urls: Urls) -> None:
        status, location, _, _ = await _ask("GET", urls.client_port + "//evil.example/")
        assert status == 404 and not location.startswith("//")


class TestTheBenchRoute:
    async def test_it_offers_its_own_methods_and_not_the_models_delete(self, urls: Urls) -> None:
        """/api/v1/models/{name} (DELETE) took m/bench as a model's name: OPTIONS offered DELETE, and a
        DELETE was redirected to /api/v1/models/m/benc."""
        for base in (urls.admin, urls.client_port + "/admin"):
            for method in ("OPTIONS", "DELETE"):
                status, location, allow, _ = await _ask(method, base + "/api/v1/models/sim-chat/bench")
                assert (status, location, allow) == (405, "", "GET,POST"), (base, method)
        # A model whose name ends in /bench is still removed by its name, encoded as one segment.
        status, _, _, body = await _ask("DELETE", urls.admin + "/api/v1/models/org%2Fbench")
        assert status == 404 and isinstance(body, dict) and "no model org/bench" in body["error"]
