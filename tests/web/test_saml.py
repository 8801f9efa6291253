"""Signing in to the pages through a real SAML 2.0 identity provider (SimpleSAMLphp, run by PHP)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestServer

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.config.classes import SamlConfig
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store
from llmgw.store.scopes import create_org, create_project, create_team
from llmgw.store.users import get_user_by_email
from llmgw.web.app import mount_pages
from llmgw.web.context import WebContext
from llmgw.web.saml import FLOW_COOKIE, SamlError, SamlFlow, ServiceProvider
from tests.web.conftest import PASSWORD, Site, _NoReplicas, csrf_of
from tests.web.oidc_idp import _HIDDEN, _post_form, free_port
from tests.web.saml_idp import SamlIdp, answer_of_saml_provider, running_saml_idp, sign_in_at_saml_provider

if TYPE_CHECKING:
    from playwright.async_api import Page


@attrs.define
class SamlSite:
    site: Site
    idp: SamlIdp
    research: int


@pytest.fixture
def saml_changes() -> dict[str, object]:
    return {}


@pytest.fixture
async def saml(store: Store, tmp_path: Path, saml_changes: dict[str, object]) -> AsyncIterator[SamlSite]:
    org = await create_org(store, "acme")
    team = await create_team(store, org.id, "ml")
    research = await create_project(store, team.id, "research")
    site_port, idp_port = free_port(), free_port()
    site_url = f"http://127.0.0.1:{site_port}"
    async with running_saml_idp(tmp_path, site_url, idp_port) as idp:
        idp.set_user("ada", "ada@example.com", ["ml-team"])
        idp.set_user("root", "root@example.com", ["llm-admins", "ml-team"])
        idp.set_user("eve", "eve@example.com", ["marketing"])
        settings = SamlConfig(
            idp_metadata=idp.metadata_url,
            base_url=site_url,
            groups={"llm-admins": "admin", "ml-team": "team:ml"},
        )
        cfg = ServerConfig(
            auth=AuthConfig(saml=attrs.evolve(settings, **saml_changes)),
            models=[ModelConfig(name="sim-chat")],
        )
        catalog = Catalog(cfg)
        app = make_gateway_app(cfg, catalog, _NoReplicas(), KeyCache())
        ctx = WebContext(cfg=cfg, store=store)
        mount_pages(app, ctx)
        server = TestServer(app, host="127.0.0.1", port=site_port)
        await server.start_server()
        try:
            yield SamlSite(
                site=Site(store=store, ctx=ctx, server=server, catalog=catalog), idp=idp, research=research.id
            )
        finally:
            await server.close()


def _browser(saml: SamlSite) -> aiohttp.ClientSession:
    # unsafe: keep cookies set by an IP address (127.0.0.1), as browsers do.
    return aiohttp.ClientSession(base_url=saml.site.url, cookie_jar=aiohttp.CookieJar(unsafe=True))


@pytest.fixture
async def client(saml: SamlSite) -> AsyncIterator[aiohttp.ClientSession]:
    async with _browser(saml) as c:
        yield c


async def _page_error(response: aiohttp.ClientResponse) -> str:
    page = await response.text()
    found = re.search(r'<p class="flash error" role="alert">(.*?)</p>', page, re.S)
    assert found is not None, f"no error on the page ({response.status}): {page[:800]}"
    return html.unescape(found.group(1))


def _answer_in(page: str) -> str:
    fields = {name: html.unescape(value) for name, value in _HIDDEN.findall(page)}
    return fields["SAMLResponse"]


async def test_a_person_in_a_mapped_group_signs_in_through_the_saml_provider(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    login_page = await (await client.get("/login")).text()
    assert 'href="/login/saml?next=/profile"' in login_page and 'name="password"' in login_page
    response = await sign_in_at_saml_provider(client, "root")
    assert response.status == 200 and response.url.path == "/profile", await response.text()
    root = await get_user_by_email(saml.site.store, "root@example.com")
    assert root is not None and root.active and root.is_admin and root.source == "saml"
    assert root.project_id == saml.research and root.groups == ("llm-admins", "ml-team")
    assert (await client.get("/admin/users")).status == 200


async def test_leaving_a_group_at_the_saml_provider_takes_what_it_gave_at_the_next_sign_in(
    saml: SamlSite,
) -> None:
    async with _browser(saml) as first:
        assert (await sign_in_at_saml_provider(first, "root")).url.path == "/profile"
    saml.idp.set_user("root", "root@example.com", ["llm-admins"])
    async with _browser(saml) as second:
        assert (await sign_in_at_saml_provider(second, "root")).url.path == "/profile"
    root = await get_user_by_email(saml.site.store, "root@example.com")
    assert root is not None and root.is_admin and root.project_id is None
    saml.idp.set_user("root", "root@example.com", ["marketing"])
    async with _browser(saml) as third:
        response = await sign_in_at_saml_provider(third, "root")
        assert response.status == 401
        assert "you are in none of the groups this server lets in" in await _page_error(response)
    root = await get_user_by_email(saml.site.store, "root@example.com")
    assert root is not None and not root.is_admin


async def test_an_answer_changed_after_the_provider_signed_it_is_refused_in_words(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    page = await (await answer_of_saml_provider(client, "ada")).text()
    forged = base64.b64decode(_answer_in(page)).decode().replace("ada@example.com", "root@example.com")
    response = await client.post(
        "/login/saml/acs", data={"SAMLResponse": base64.b64encode(forged.encode()).decode()}
    )
    assert response.status == 401
    assert "not signed by the key its metadata names" in await _page_error(response)
    assert await get_user_by_email(saml.site.store, "root@example.com") is None


async def test_an_answer_with_its_signatures_taken_out_is_refused(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    page = await (await answer_of_saml_provider(client, "ada")).text()
    signed = base64.b64decode(_answer_in(page)).decode()
    unsigned = re.sub(r"<ds:Signature.*?</ds:Signature>", "", signed, flags=re.S)
    assert unsigned != signed
    response = await client.post(
        "/login/saml/acs", data={"SAMLResponse": base64.b64encode(unsigned.encode()).decode()}
    )
    assert response.status == 401
    assert "not signed by the key its metadata names" in await _page_error(response)
    assert await get_user_by_email(saml.site.store, "ada@example.com") is None


async def test_an_answer_signed_by_a_key_not_in_the_providers_metadata_is_refused(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    # This server read the metadata, with the provider's certificate, as it started.
    saml.idp.new_signing_key()
    response = await sign_in_at_saml_provider(client, "ada")
    assert response.status == 401
    assert "not signed by the key its metadata names" in await _page_error(response)


async def test_an_answer_posted_again_is_refused(saml: SamlSite, client: aiohttp.ClientSession) -> None:
    page = await answer_of_saml_provider(client, "ada")
    answer = _answer_in(await page.text())
    assert (await _post_form(client, page)).url.path == "/profile"
    again = await client.post("/login/saml/acs", data={"SAMLResponse": answer})
    assert again.status == 400
    assert "no sign-in in progress" in await _page_error(again)


async def test_an_answer_to_another_browsers_sign_in_is_refused(saml: SamlSite) -> None:
    async with _browser(saml) as victim, _browser(saml) as attacker:
        answer = _answer_in(await (await answer_of_saml_provider(victim, "ada")).text())
        await attacker.get("/login/saml", allow_redirects=False)
        response = await attacker.post("/login/saml/acs", data={"SAMLResponse": answer})
        assert response.status == 401
        assert "not for the sign-in this browser started" in await _page_error(response)


async def test_an_answer_for_another_service_provider_is_refused(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    flow_start = await client.get("/login/saml", allow_redirects=False)
    flow = SamlFlow.from_cookie(flow_start.cookies[FLOW_COOKIE].value)
    assert flow is not None
    page = await client.get(flow_start.headers["Location"])
    page = await _post_form(client, page, username="ada", password="pass-of-ada")
    other = await ServiceProvider.load(
        attrs.evolve(saml.site.ctx.cfg.auth.saml, entity_id="https://other.example.com/saml")
    )
    with pytest.raises(
        SamlError, match=re.escape("for another service provider, not for https://other.example.com/saml")
    ):
        await other.identity(_answer_in(await page.text()), flow.request_id)


async def test_a_person_in_no_mapped_group_is_refused_in_words(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_saml_provider(client, "eve")
    assert response.status == 401
    assert "you are in none of the groups this server lets in (llm-admins, ml-team)" in await _page_error(
        response
    )
    assert await get_user_by_email(saml.site.store, "eve@example.com") is None


@pytest.mark.parametrize("saml_changes", [{"new_users": "pending"}])
async def test_new_people_wait_for_approval_when_the_setting_says_so(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_saml_provider(client, "ada")
    assert response.status == 403
    assert "waiting for an administrator to approve it" in await _page_error(response)


@pytest.mark.parametrize("saml_changes", [{"local_accounts": False}])
async def test_local_accounts_switched_off_cannot_sign_in_with_a_password(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    await saml.site.user("local@example.com")
    page = await (await client.get("/login")).text()
    assert 'name="password"' not in page and 'href="/login/saml' in page
    csrf = client.cookie_jar.filter_cookies(aiohttp.client.URL(saml.site.url))["llmgw_csrf"].value
    response = await client.post(
        "/login", data={"email": "local@example.com", "password": PASSWORD, "csrf": csrf}
    )
    assert response.status == 403


async def test_the_local_sign_in_still_works_beside_it(saml: SamlSite, client: aiohttp.ClientSession) -> None:
    await saml.site.user("local@example.com")
    page = await (await client.get("/login")).text()
    response = await client.post(
        "/login", data={"email": "local@example.com", "password": PASSWORD, "csrf": csrf_of(page)}
    )
    assert response.url.path == "/profile"


async def test_this_servers_metadata_names_the_entity_id_and_acs_the_docs_say_to_register(
    saml: SamlSite, client: aiohttp.ClientSession
) -> None:
    response = await client.get("/login/saml/metadata")
    assert response.status == 200
    document = await response.text()
    assert f'entityID="{saml.site.url}/login/saml/metadata"' in document
    assert f'Location="{saml.site.url}/login/saml/acs"' in document
    docs = (Path(__file__).parents[2] / "docs" / "accounts.md").read_text()
    assert "`BASE_URL/login/saml/acs`" in docs and "`BASE_URL/login/saml/metadata`" in docs


async def test_a_server_whose_providers_metadata_cannot_be_read_does_not_start(
    store: Store, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-metadata.xml"
    cfg = ServerConfig(
        auth=AuthConfig(saml=SamlConfig(idp_metadata=str(missing), base_url="http://127.0.0.1:2"))
    )
    app = make_gateway_app(cfg, Catalog(cfg), _NoReplicas(), KeyCache())
    mount_pages(app, WebContext(cfg=cfg, store=store))
    server = TestServer(app, host="127.0.0.1", port=0)
    with pytest.raises(SamlError, match=r"cannot read auth.saml.idp_metadata \(.*no-such-metadata.xml\)"):
        await server.start_server()
    await server.close()


async def test_chromium_signs_in_through_the_saml_provider(saml: SamlSite, chromium: Page) -> None:
    p = chromium
    errors: list[str] = []
    p.on("pageerror", lambda error: errors.append(str(error)))
    await p.goto(f"{saml.site.url}/admin/users")
    await p.click("text=Sign in with your organisation (SAML)")
    await p.wait_for_url(f"{saml.idp.url}/module.php/core/loginuserpass.php**")
    await p.fill("input[name=username]", "root")
    await p.fill("input[name=password]", "pass-of-root")
    await p.click("button[type=submit]")
    # The provider's page posts its answer here by itself, and the page that asked comes back.
    await p.wait_for_url(f"{saml.site.url}/admin/users")
    assert "root@example.com" in await p.content()
    cookies = {c["name"]: c for c in await p.context.cookies(saml.site.url)}
    assert cookies["llmgw_session"]["httpOnly"] is True and "llmgw_saml" not in cookies
    assert errors == []
