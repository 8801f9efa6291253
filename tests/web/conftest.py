"""A gateway with the pages mounted, on a real loopback port, over a fresh store; helpers to sign in."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Page, async_playwright

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.routes import EngineRoute
from llmgw.store import Store, open_store
from llmgw.store.scopes import DEFAULT_PROJECT_ID
from llmgw.store.users import User, create_user
from llmgw.web.app import mount_pages
from llmgw.web.context import WebContext
from llmgw.web.logins import LoginThrottle
from tests import needs

PASSWORD = "correct horse battery"


class _NoReplicas:
    def ready_endpoints(self, model: str) -> Sequence[str]:
        return []

    def why_no_ready(self, model: str) -> str:
        return f"{model} has no ready replica"

    def route(self, endpoint: str) -> EngineRoute | None:
        return None


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@attrs.define
class Site:
    store: Store
    ctx: WebContext
    server: TestServer
    # The gateway's live catalog, as `llmgw ctl model add` changes it.
    catalog: Catalog

    @property
    def url(self) -> str:
        return str(self.server.make_url("/")).rstrip("/")

    async def user(self, email: str, *, admin: bool = False, status: str = "active") -> User:
        project = DEFAULT_PROJECT_ID if status == "active" else None
        return await create_user(
            self.store,
            email,
            PASSWORD,
            status=status,
            is_admin=admin,
            project_id=project,  # type: ignore[arg-type]
        )


@pytest.fixture
def signup_open() -> bool:
    return True


@pytest.fixture
def logins() -> LoginThrottle:
    """The site's count of failed sign-ins; a test of lockouts gives it a clock of its own."""
    return LoginThrottle()


@pytest.fixture
async def site(store: Store, signup_open: bool, logins: LoginThrottle) -> AsyncIterator[Site]:
    cfg = ServerConfig(
        auth=AuthConfig(enabled=True, signup_open=signup_open), models=[ModelConfig(name="sim-chat")]
    )
    catalog = Catalog(cfg)
    app = make_gateway_app(cfg, catalog, _NoReplicas(), KeyCache())
    ctx = WebContext(cfg=cfg, store=store, logins=logins)
    mount_pages(app, ctx)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield Site(store=store, ctx=ctx, server=server, catalog=catalog)
    finally:
        await server.close()


def browser(site: Site) -> aiohttp.ClientSession:
    """A client with its own cookies, like one browser; use several for several people."""
    # unsafe: keep cookies set by an IP address (127.0.0.1), as browsers do.
    return aiohttp.ClientSession(base_url=site.url, cookie_jar=aiohttp.CookieJar(unsafe=True))


@pytest.fixture
async def client(site: Site) -> AsyncIterator[aiohttp.ClientSession]:
    async with browser(site) as client:
        yield client


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token of the first form on a page."""
    found = _CSRF.search(html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


async def login(client: aiohttp.ClientSession, email: str, password: str = PASSWORD) -> str:
    """Sign in as email; returns the session's CSRF token (from the page signing in leads to)."""
    page = await client.get("/login")
    response = await client.post(
        "/login", data={"email": email, "password": password, "csrf": csrf_of(await page.text())}
    )
    assert response.status == 200, await response.text()
    return csrf_of(await response.text())


_NAV = re.compile(r"<nav>(.*?)</nav>", re.S)
_NAV_LINK = re.compile(r'<a href="([^"]+)"[^>]*>([^<]+)</a>')


async def nav_links(client: aiohttp.ClientSession, path: str) -> list[tuple[str, str]]:
    """The (href, label) pairs of the navigation at the top of the page at path."""
    page = await client.get(path)
    assert page.status == 200, path
    found = _NAV.search(await page.text())
    assert found is not None, f"{path} has no navigation"
    return _NAV_LINK.findall(found.group(1))


@pytest.fixture
async def chromium() -> AsyncIterator[Page]:
    """A page of a fresh Chromium, for the tests that sign in through a provider's own pages."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=needs.program("chromium", "chromium"),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
        )
        try:
            yield await (await browser.new_context()).new_page()
        finally:
            await browser.close()
