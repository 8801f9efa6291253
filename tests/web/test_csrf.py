"""No state-changing route of the client port acts for an administrator's session without its CSRF token.

The routes are read from the app's router, not listed by hand: a route added later is
covered by being added, and a state-changing route this test does not know how to call
fails it. Each is sent, from an administrator's browser, once without a token and once
with a forged one, and must be refused and leave every table of the store as it was.
A skipped check for one shape (/admin/users/{id}/approve, promote, disable, once) left
every other web test passing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.gateway.apis import APIS
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.scopes import DEFAULT_PROJECT_ID
from llmgw.store.users import create_user
from llmgw.tenancy import operations as tenancy
from llmgw.web import admin_listener
from llmgw.web.client_port import ADMIN, mount_client_port
from llmgw.web.context import WebContext

from .conftest import PASSWORD, login

_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
# Routes that read no cookie: a client's API key is the credential, which a page elsewhere does not have.
# Every API the gateway serves (gateway/apis.py), and the stored-response paths, which only say the
# gateway keeps none.
_KEY_ONLY = frozenset(
    [*(path for api in APIS for path in api.paths), "/v1/responses/{id}", "/v1/responses/{id}/{what}"]
)

# Posted by another site by design, and bound to the browser otherwise than by a CSRF token: the
# SAML provider's answer must be signed and name the request in this browser's llmgw_saml cookie
# (tests/web/test_saml.py refuses a forged, replayed or another browser's answer). Here, with no
# provider set up, it changes nothing.
_BOUND_OTHERWISE = frozenset(["/login/saml/acs"])

# Forms of the pages, by route: each a change the store would show, had the token been right.
_FORMS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "/login": [("/login", {"email": "ana@example.com", "password": PASSWORD})],
    "/logout": [("/logout", {})],
    "/signup": [("/signup", {"email": "new@example.com", "password": PASSWORD, "password2": PASSWORD})],
    "/profile/password": [
        (
            "/profile/password",
            {"current": PASSWORD, "password": "another long one", "password2": "another long one"},
        )
    ],
    "/profile/keys": [("/profile/keys", {"name": "ci"})],
    "/profile/keys/{key_id}/revoke": [("/profile/keys/{key}/revoke", {})],
    "/admin/users/{user_id}/{action}": [
        ("/admin/users/{pending}/approve", {}),
        ("/admin/users/{ana}/promote", {}),
        ("/admin/users/{ana}/disable", {}),
    ],
    "/admin/projects/{action}": [
        ("/admin/projects/create", {"kind": "org", "name": "acme"}),
        ("/admin/projects/rename", {"kind": "project", "id": "default", "name": "renamed"}),
        ("/admin/projects/delete", {"kind": "project", "id": "spare"}),
        ("/admin/projects/member-add", {"id": "spare", "user": "ana@example.com"}),
        ("/admin/projects/member-remove", {"id": "default", "user": "ana@example.com"}),
        ("/admin/projects/models", {"id": "default", "models": "sim-chat"}),
    ],
    "/admin/quotas": [("/admin/quotas", {"scope": "project:default", "rpm": "5", "budget": "", "tpm": ""})],
}

# The admin API under /admin, by operation: the path's parameters and a body that would change something.
_API: dict[str, tuple[dict[str, str], Any]] = {
    "setNodeState": ({"id": "n1"}, {"state": "cordoned"}),
    "addModel": ({}, {"name": "added", "profiles": [{"engine": "sim"}]}),
    "removeModel": ({"name": "sim-chat"}, None),
    "collectWeights": ({}, {}),
    "keepBench": (
        {"name": "sim-chat"},
        {"model": "sim-chat", "started_at": "2026-01-01T00:00:00+00:00", "prompt_tokens": 1, "max_tokens": 1}
        | {"seconds": 1.0, "levels": []},
    ),
    "createOrg": ({}, {"name": "acme"}),
    "renameOrg": ({"item": "default"}, {"name": "renamed"}),
    "deleteOrg": ({"item": "default"}, None),
    "createTeam": ({}, {"name": "core", "parent": "default"}),
    "renameTeam": ({"item": "default"}, {"name": "renamed"}),
    "deleteTeam": ({"item": "default"}, None),
    "createProject": ({}, {"name": "web", "parent": "default"}),
    "renameProject": ({"item": "spare"}, {"name": "renamed"}),
    "deleteProject": ({"item": "spare"}, None),
    "setProjectModels": ({"item": "default"}, {"models": ["sim-chat"]}),
    "addMember": ({"item": "spare"}, {"user": "ana@example.com"}),
    "removeMember": ({"item": "default", "user": "ana@example.com"}, None),
    "setQuota": ({"scope": "project:default"}, {"rpm": 5}),
    "clearQuota": ({"scope": "project:default"}, None),
    "setPrice": ({"model": "sim-chat"}, {"prompt_per_1k": 1, "completion_per_1k": 2}),
    "clearPrice": ({"model": "sim-chat"}, None),
    "mirrorRemoveModel": ({}, None),
    "mirrorFetch": ({}, {"model": "org/model"}),
    "upgradeAgents": (
        {},
        {"version": "0.2.0", "sha256": "0" * 64, "url": "/tmp/llmgw-0.2.0-py3-none-any.whl"},
    ),
}


@pytest.fixture
async def client_port(store: Store) -> AsyncIterator[tuple[web.Application, str]]:
    """The client port as the server role mounts it: the pages, and the admin pages and API under /admin."""
    cfg = ServerConfig(auth=AuthConfig(enabled=True, signup_open=True), models=[ModelConfig(name="sim-chat")])
    catalog = Catalog(cfg, store)
    inventory = Inventory(5.0)
    app = make_gateway_app(cfg, catalog, inventory, KeyCache())
    mount_client_port(app, cfg, inventory, catalog, WebContext(cfg=cfg, store=store))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield app, str(server.make_url("/")).rstrip("/")
    finally:
        await server.close()


async def _tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    names = await store.fetch_all("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    return {
        row["name"]: sorted(
            (tuple(r) for r in await store.fetch_all(f'SELECT * FROM "{row["name"]}"')),
            key=repr,
        )
        for row in names
    }


def _state_changing(app: web.Application) -> set[tuple[str, str]]:
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method not in _SAFE and route.resource is not None
    }


async def test_no_state_changing_route_of_the_client_port_acts_without_the_sessions_csrf_token(
    store: Store, client_port: tuple[web.Application, str]
) -> None:
    app, url = client_port
    await create_user(
        store, "root@example.com", PASSWORD, status="active", is_admin=True, project_id=DEFAULT_PROJECT_ID
    )  # type: ignore[arg-type]
    ana = await create_user(
        store, "ana@example.com", PASSWORD, status="active", project_id=DEFAULT_PROJECT_ID
    )  # type: ignore[arg-type]
    pending = await create_user(store, "pending@example.com", PASSWORD, status="pending")
    await tenancy.create(store, "project", "spare", "default")
    _, key = await create_key(store, "root-key", project_id=DEFAULT_PROJECT_ID)
    ids = {"ana": str(ana.id), "pending": str(pending.id), "key": str(key.id)}

    api = {
        (route.method, ADMIN + route.path): route for route in admin_listener.API if route.method not in _SAFE
    }
    routes = _state_changing(app)
    unknown = sorted(
        (method, path)
        for method, path in routes
        if path not in _FORMS
        and path not in _KEY_ONLY
        and path not in _BOUND_OTHERWISE
        and (method, path) not in api
    )
    assert unknown == [], f"state-changing routes this test does not know how to call: {unknown}"
    missing = sorted(r.operation or r.path for r in api.values() if r.operation not in _API)
    assert missing == [], f"admin API operations this test has no request for: {missing}"

    async with aiohttp.ClientSession(base_url=url, cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        await login(browser, "root@example.com")
        before = await _tables(store)
        tried = 0
        for method, path in sorted(routes):
            if path in _KEY_ONLY:
                continue
            if path in _BOUND_OTHERWISE:
                async with browser.request(method, path, data={"SAMLResponse": "forged"}) as answer:
                    assert answer.status == 404, (path, answer.status)
                assert await _tables(store) == before, path
                continue
            if path in _FORMS:
                for target, form in _FORMS[path]:
                    for token in (None, "forged"):
                        data = dict(form) if token is None else {**form, "csrf": token}
                        async with browser.request(method, target.format(**ids), data=data) as answer:
                            assert answer.status == 403, (target, token, answer.status)
                        assert await _tables(store) == before, (target, token)
                        tried += 1
                continue
            route = api[(method, path)]
            params, body = _API[route.operation or ""]
            target = ADMIN + route.path.format(**params)
            for headers in ({}, {"X-CSRF-Token": "forged"}):
                async with browser.request(method, target, json=body, headers=headers) as answer:
                    # The API's refusal is its own (401, as for no token at all), not the pages' 403.
                    assert answer.status == 401, (target, headers, answer.status)
                    assert "X-CSRF-Token" in await answer.text()
                assert await _tables(store) == before, (target, headers)
                tried += 1
    assert tried >= 2 * (len(api) + sum(len(v) for v in _FORMS.values()))
