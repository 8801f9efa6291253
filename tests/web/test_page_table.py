"""A new admin page is its module, its template and one declaration in the listener's table of pages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.adminapi.routes import Reply, Route
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.store import Store, open_store
from llmgw.web import admin_listener
from llmgw.web.admin_listener import document, make_admin_app
from llmgw.web.client_port import mount_client_port
from llmgw.web.context import ADMIN_LINKS_KEY, AdminLink, WebContext

CFG = ServerConfig()


async def _fleet_page(request: web.Request) -> web.StreamResponse:
    return web.Response(text="<p>the fleet</p>", content_type="text/html")


FLEET = Route(
    method="GET",
    path="/fleet",
    handler=_fleet_page,
    operation="fleetPage",
    summary="The fleet at a glance.",
    replies={200: Reply("HTML.", html=True)},
    link="Fleet",
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@pytest.fixture
def with_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one declaration: the page in the admin listener's table."""
    monkeypatch.setattr(admin_listener, "PAGES", (*admin_listener.PAGES, FLEET))


@pytest.mark.usefixtures("with_fleet")
class TestAPageDeclaredInTheTable:
    async def test_the_admin_listener_serves_it_links_it_and_documents_it(self, store: Store):
        app = make_admin_app(CFG, Inventory(5.0), Catalog(CFG), WebContext(cfg=CFG, store=store))
        assert app[ADMIN_LINKS_KEY][-1] == AdminLink("/fleet", "Fleet")
        assert document("test")["paths"]["/fleet"]["get"]["tags"] == ["pages"]
        async with (
            TestServer(app, host="127.0.0.1", port=0) as server,
            aiohttp.ClientSession() as http,
            http.get(server.make_url("/fleet")) as answer,
        ):
            assert (answer.status, await answer.text()) == (200, "<p>the fleet</p>")

    async def test_the_client_port_serves_it_under_admin_to_administrators_only_and_links_it(
        self, store: Store
    ):
        app = web.Application()
        mount_client_port(app, CFG, Inventory(5.0), Catalog(CFG), WebContext(cfg=CFG, store=store))
        assert app[ADMIN_LINKS_KEY][-1] == AdminLink("/admin/fleet", "Fleet")
        async with (
            TestServer(app, host="127.0.0.1", port=0) as server,
            aiohttp.ClientSession() as http,
            http.get(server.make_url("/admin/fleet"), allow_redirects=False) as answer,
        ):
            # No session: sent to sign in, never shown the page.
            assert answer.status in (302, 303) and "/login" in answer.headers["Location"]
