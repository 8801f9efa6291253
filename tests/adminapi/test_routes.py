"""The route tables: a route declared once in a listener's table is served and in the OpenAPI document."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openapi_spec_validator import validate

from llmgw.adminapi import views
from llmgw.adminapi.openapi import paths
from llmgw.adminapi.replies import reply
from llmgw.adminapi.routes import Body, Param, Reply, Route
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.store import Store, open_store
from llmgw.web import admin_listener
from llmgw.web.admin_listener import document, make_admin_app
from llmgw.web.client_port import mount_client_port
from llmgw.web.context import WebContext

CFG = ServerConfig()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


def _admin_app(store: Store) -> web.Application:
    return make_admin_app(CFG, Inventory(5.0), Catalog(CFG), WebContext(cfg=CFG, store=store))


def _served(app: web.Application) -> set[tuple[str, str]]:
    return {
        (route.resource.canonical, route.method)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }


def _documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(path, method.upper()) for path, item in doc["paths"].items() for method in item}


def _table() -> set[tuple[str, str]]:
    return {(route.path, route.method) for route in (*admin_listener.PAGES, *admin_listener.API)}


class TestTheAdminListenersTable:
    async def test_every_route_of_the_table_is_served_and_the_document_lists_the_table_exactly(
        self, store: Store
    ):
        assert _table() <= _served(_admin_app(store))
        assert _documented(document("test")) == _table()

    async def test_the_client_port_serves_the_same_api_and_pages_under_admin(self, store: Store):
        app = web.Application()
        mount_client_port(app, CFG, Inventory(5.0), Catalog(CFG), WebContext(cfg=CFG, store=store))
        served = _served(app)
        assert {("/admin" + r.path, r.method) for r in admin_listener.API} <= served
        # No mirror: its page and the relay are there all the same, to say that there is none.
        assert {(r.at("/admin"), r.method) for r in admin_listener.PAGES} <= served
        assert ("/admin/mirror", "GET") in served


async def _hello(request: web.Request) -> web.Response:
    return reply(views.Removed(name=request.match_info["name"], removed=False))


HELLO = Route(
    method="GET",
    path="/api/v1/hello/{name}",
    handler=_hello,
    operation="hello",
    summary="Say hello; a name may hold slashes.",
    parameters=(Param("name", description="Who to greet.", pattern=".+"),),
    replies={200: Reply("Greeted.", views.Removed)},
)


class TestARouteAddedToTheTable:
    async def test_is_served_on_both_listeners_and_documented_by_its_one_declaration(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ):
        monkeypatch.setattr(admin_listener, "API", (*admin_listener.API, HELLO))
        admin = _admin_app(store)
        client_port = web.Application()
        mount_client_port(client_port, CFG, Inventory(5.0), Catalog(CFG), WebContext(cfg=CFG, store=store))
        assert ("/api/v1/hello/{name}", "GET") in _served(admin)
        assert ("/admin/api/v1/hello/{name}", "GET") in _served(client_port)
        async with TestServer(admin, host="127.0.0.1", port=0) as server, aiohttp.ClientSession() as http:
            async with http.get(server.make_url("/api/v1/hello/org/ana")) as answer:
                assert answer.status == 200
                assert await answer.json() == {"name": "org/ana", "removed": False}
            async with http.get(server.make_url("/api/v1/openapi.json")) as answer:
                served_doc = await answer.json()
        validate(served_doc)
        operation = served_doc["paths"]["/api/v1/hello/{name}"]["get"]
        assert operation["operationId"] == "hello"
        assert operation["parameters"] == [
            {
                "name": "name",
                "in": "path",
                "required": True,
                "description": "Who to greet.",
                "schema": {"type": "string"},
            }
        ]
        assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Removed"
        }

    def test_a_route_with_a_json_body_is_documented_as_refusing_a_body_that_is_not_json(self):
        change = Route(
            method="POST",
            path="/api/v1/hello",
            handler=_hello,
            operation="changeHello",
            summary="Change a greeting.",
            body=Body(views.StateChange),
            replies={200: Reply("Changed.", views.Removed)},
        )

        responses = paths([change])["/api/v1/hello"]["post"]["responses"]
        assert sorted(responses) == ["200", "400", "413", "415"]
