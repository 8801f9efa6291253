"""Signing in to the pages through a real OpenID Connect provider (oidc-provider, run by node)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.config.classes import OidcConfig
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store
from llmgw.store.keys import find_key, hash_key
from llmgw.store.scopes import (
    DEFAULT_PROJECT_ID,
    DEFAULT_TEAM_ID,
    create_org,
    create_project,
    create_team,
    load_hierarchy,
)
from llmgw.store.users import User, approve_user, get_user_by_email
from llmgw.web.app import mount_pages
from llmgw.web.context import WebContext
from llmgw.web.oidc import FLOW_COOKIE, JWKS_REFRESH_S, MAX_ANSWER, Flow, OidcError, Provider, read_secret
from llmgw.web.sessions import SESSION_COOKIE
from tests.web.conftest import PASSWORD, Site, _NoReplicas, csrf_of
from tests.web.oidc_idp import (
    CLIENT_ID,
    CLIENT_SECRET,
    Idp,
    _post_form,
    free_port,
    running_idp,
    sign_in_at_provider,
    through_provider,
)

if TYPE_CHECKING:
    from playwright.async_api import Page

SECRET_ENV = "LLMGW_TEST_OIDC_SECRET"


@attrs.define
class Sso:
    site: Site
    idp: Idp
    research: int


def _oidc(issuer: str, site_url: str, **changes: object) -> OidcConfig:
    base = OidcConfig(
        issuer=issuer,
        client_id=CLIENT_ID,
        client_secret_env=SECRET_ENV,
        base_url=site_url,
        scopes=["openid", "email", "groups"],
        groups={"llm-admins": "admin", "ml-team": "project:research"},
    )
    return attrs.evolve(base, **changes)


@pytest.fixture
def oidc_changes() -> dict[str, object]:
    return {}


@pytest.fixture
def disabled_user_keys() -> str:
    return "keep"


@pytest.fixture
async def sso(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    oidc_changes: dict[str, object],
    disabled_user_keys: str,
) -> AsyncIterator[Sso]:
    monkeypatch.setenv(SECRET_ENV, CLIENT_SECRET)
    org = await create_org(store, "acme")
    team = await create_team(store, org.id, "ml")
    research = await create_project(store, team.id, "research")
    site_port, idp_port = free_port(), free_port()
    site_url = f"http://127.0.0.1:{site_port}"
    cfg = ServerConfig(
        auth=AuthConfig(
            oidc=_oidc(f"http://127.0.0.1:{idp_port}", site_url, **oidc_changes),
            disabled_user_keys=disabled_user_keys,  # type: ignore[arg-type]
        ),
        models=[ModelConfig(name="sim-chat")],
    )
    catalog = Catalog(cfg)
    app = make_gateway_app(cfg, catalog, _NoReplicas(), KeyCache())
    ctx = WebContext(cfg=cfg, store=store)
    mount_pages(app, ctx)
    server = TestServer(app, host="127.0.0.1", port=site_port)
    await server.start_server()
    try:
        async with running_idp(tmp_path, site_url, idp_port) as idp:
            idp.set_user("ada", "ada@example.com", ["ml-team"])
            idp.set_user("root", "root@example.com", ["llm-admins", "ml-team"])
            idp.set_user("eve", "eve@example.com", ["marketing"])
            yield Sso(
                site=Site(store=store, ctx=ctx, server=server, catalog=catalog), idp=idp, research=research.id
            )
    finally:
        await server.close()


def _browser(sso: Sso) -> aiohttp.ClientSession:
    # unsafe: keep cookies set by an IP address (127.0.0.1), as browsers do.
    return aiohttp.ClientSession(base_url=sso.site.url, cookie_jar=aiohttp.CookieJar(unsafe=True))


@pytest.fixture
async def client(sso: Sso) -> AsyncIterator[aiohttp.ClientSession]:
    async with _browser(sso) as c:
        yield c


async def test_a_person_in_a_mapped_group_signs_in_with_code_flow_and_pkce_into_their_project(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    login_page = await (await client.get("/login")).text()
    assert 'href="/login/oidc?next=/profile"' in login_page
    response = await sign_in_at_provider(client, "ada")
    assert response.status == 200, await response.text()
    assert response.url.path == "/profile"
    assert "research" in await response.text()
    user = await get_user_by_email(sso.site.store, "ada@example.com")
    assert user is not None and user.active and not user.is_admin and user.project_id == sso.research
    # No password here, so none to change.
    profile = await response.text()
    assert "Change password" not in profile and "has no password here" in profile


async def test_the_provider_is_sent_the_redirect_uri_the_docs_say_to_register(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    started = await client.get("/login/oidc", allow_redirects=False)
    query = URL(started.headers["Location"]).query
    assert query["redirect_uri"] == f"{sso.site.url}/login/oidc/callback"
    assert query["code_challenge_method"] == "S256" and query["response_type"] == "code"
    docs = (Path(__file__).parents[2] / "docs" / "accounts.md").read_text()
    assert "**redirect URI** `BASE_URL/login/oidc/callback`" in docs


async def test_a_server_with_a_provider_and_no_client_secret_does_not_start(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    cfg = ServerConfig(auth=AuthConfig(oidc=_oidc("http://127.0.0.1:1", "http://127.0.0.1:2")))
    app = make_gateway_app(cfg, Catalog(cfg), _NoReplicas(), KeyCache())
    mount_pages(app, WebContext(cfg=cfg, store=store))
    server = TestServer(app, host="127.0.0.1", port=0)
    with pytest.raises(OidcError, match="has no client secret"):
        await server.start_server()
    await server.close()


async def _page_error(response: aiohttp.ClientResponse) -> str:
    page = await response.text()
    found = re.search(r'<p class="flash error" role="alert">(.*?)</p>', page, re.S)
    assert found is not None, f"no error on the page: {page[:800]}"
    return html.unescape(found.group(1))


async def _start_at_provider(client: aiohttp.ClientSession) -> aiohttp.ClientResponse:
    """As sign_in_at_provider, but stop before the provider sends the browser back."""
    response = await client.get("/login/oidc", allow_redirects=False)
    assert response.status == 303
    return response


async def test_an_administrators_group_makes_an_administrator_and_leaving_it_unmakes_one(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_provider(client, "root")
    assert response.url.path == "/profile"
    user = await get_user_by_email(sso.site.store, "root@example.com")
    assert user is not None and user.is_admin and user.project_id == sso.research
    users_page = await client.get("/admin/users")
    assert users_page.status == 200
    assert '<span class="muted">oidc: llm-admins, ml-team</span>' in await users_page.text()
    # Taken out of both groups' grants but one: at the next sign-in the role goes.
    sso.idp.set_user("root", "root@example.com", ["ml-team"])
    await client.post("/logout", data={"csrf": csrf_of(await (await client.get("/profile")).text())})
    async with _browser(sso) as again:
        assert (await sign_in_at_provider(again, "root")).url.path == "/profile"
        user = await get_user_by_email(sso.site.store, "root@example.com")
        assert user is not None and not user.is_admin
        assert (await again.get("/admin/users")).status == 403
    # Out of every mapped group: refused, and the project membership goes too.
    sso.idp.set_user("root", "root@example.com", ["marketing"])
    async with _browser(sso) as third:
        error = await _page_error(await sign_in_at_provider(third, "root"))
        assert "none of the groups this server lets in (llm-admins, ml-team)" in error


async def test_a_person_in_no_mapped_group_is_refused_in_words(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_provider(client, "eve")
    assert response.status == 401
    assert "you are in none of the groups this server lets in" in await _page_error(response)
    assert (await client.get("/profile", allow_redirects=False)).status == 303


async def test_a_tampered_state_is_refused_in_words(sso: Sso, client: aiohttp.ClientSession) -> None:
    await _start_at_provider(client)
    response = await client.get("/login/oidc/callback", params={"state": "forged", "code": "whatever"})
    assert response.status == 400
    assert "state is not the one this sign-in sent" in await _page_error(response)


async def test_a_replayed_answer_from_the_provider_is_refused(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_provider(client, "ada")
    assert response.url.path == "/profile"
    answers = [str(step.url) for step in response.history if step.url.path == "/login/oidc/callback"]
    assert len(answers) == 1
    again = await client.get(answers[0])
    # Signed in already, so the page shown is the refusal: the sign-in's cookie is spent.
    assert again.status == 400
    assert "no sign-in in progress" in await _page_error(again)


async def test_next_after_sign_in_stays_a_path_on_this_site(sso: Sso, client: aiohttp.ClientSession) -> None:
    response = await sign_in_at_provider(client, "ada", start="/login/oidc?next=/profile%3Fx%3D1")
    assert response.url.path == "/profile" and response.url.query_string == "x=1"
    async with _browser(sso) as other:
        response = await sign_in_at_provider(other, "ada", start="/login/oidc?next=https://evil.example.com/")
        assert str(response.url) == f"{sso.site.url}/profile"


@pytest.mark.parametrize("oidc_changes", [{"new_users": "pending"}])
async def test_new_people_wait_for_approval_when_the_setting_says_so(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_provider(client, "ada")
    assert response.status == 403
    assert "waiting for an administrator to approve it" in await _page_error(response)
    user = await get_user_by_email(sso.site.store, "ada@example.com")
    assert user is not None and user.status == "pending"


async def test_local_accounts_still_sign_in_when_kept(sso: Sso, client: aiohttp.ClientSession) -> None:
    await sso.site.user("local@example.com")
    page = await (await client.get("/login")).text()
    response = await client.post(
        "/login", data={"email": "local@example.com", "password": PASSWORD, "csrf": csrf_of(page)}
    )
    assert response.url.path == "/profile"


@pytest.mark.parametrize("oidc_changes", [{"local_accounts": False}])
async def test_local_accounts_switched_off_cannot_sign_in_with_a_password(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    await sso.site.user("local@example.com")
    page = await (await client.get("/login")).text()
    assert 'name="password"' not in page and 'href="/login/oidc' in page
    # A form posted by hand, with the browser's own CSRF token: refused all the same.
    csrf = client.cookie_jar.filter_cookies(URL(sso.site.url))["llmgw_csrf"].value
    response = await client.post(
        "/login", data={"email": "local@example.com", "password": PASSWORD, "csrf": csrf}
    )
    assert response.status == 403
    assert "through the identity provider only" in await _page_error(response)


async def test_a_wrong_client_secret_is_refused_in_words(sso: Sso, client: aiohttp.ClientSession) -> None:
    assert sso.site.ctx.oidc is not None
    sso.site.ctx.oidc = attrs.evolve(sso.site.ctx.oidc, secret="not-the-secret")
    response = await sign_in_at_provider(client, "ada")
    assert response.status == 401
    error = await _page_error(response)
    assert "refused this server's client id or secret (invalid_client)" in error
    assert "not-the-secret" not in await response.text()


def test_the_client_secret_comes_from_a_file_and_is_never_shown(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(CLIENT_SECRET + "\n")
    cfg = _oidc(
        "http://127.0.0.1:1", "http://127.0.0.1:2", client_secret_env="", client_secret_file=str(secret_file)
    )
    provider = Provider(cfg, read_secret(cfg))
    assert provider.secret == CLIENT_SECRET
    assert CLIENT_SECRET not in repr(provider)
    with pytest.raises(OidcError, match="has no client secret: set client_secret_file or client_secret_env"):
        read_secret(attrs.evolve(cfg, client_secret_file=""))


async def test_a_key_rotated_at_the_provider_still_signs_people_in(sso: Sso) -> None:
    async with _browser(sso) as first:
        assert (await sign_in_at_provider(first, "ada")).url.path == "/profile"
    await sso.idp.rotate("second")
    # The keys fetched before would let a token naming "second" through only by fetching them again.
    assert sso.site.ctx.oidc is not None
    sso.site.ctx.oidc._keys_at -= JWKS_REFRESH_S
    async with _browser(sso) as second:
        assert (await sign_in_at_provider(second, "ada")).url.path == "/profile"


async def test_a_provider_that_does_not_answer_is_named_and_local_sign_in_still_works(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    await sso.idp.stop()
    response = await client.get("/login/oidc")
    assert response.status == 502
    error = await _page_error(response)
    assert f"the identity provider at {sso.idp.issuer} did not answer for its discovery document" in error
    await sso.site.user("local@example.com")
    page = await (await client.get("/login")).text()
    response = await client.post(
        "/login", data={"email": "local@example.com", "password": PASSWORD, "csrf": csrf_of(page)}
    )
    assert response.url.path == "/profile"


async def test_logout_of_a_provider_session_ends_it_at_the_provider_too(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    await sign_in_at_provider(client, "ada")
    csrf = csrf_of(await (await client.get("/profile")).text())
    response = await client.post("/logout", data={"csrf": csrf}, allow_redirects=False)
    assert response.status == 303
    location = response.headers["Location"]
    assert location.startswith(f"{sso.idp.issuer}/session/end?")
    assert (
        f"post_logout_redirect_uri={sso.site.url}/login".replace(":", "%3A").replace("/", "%2F") in location
    )
    assert (await client.get("/profile", allow_redirects=False)).status == 303
    # The provider's logout page is a form asking to confirm; posting it comes back to /login.
    ended = await _post_form(client, await client.get(location), logout="yes")
    assert ended.url.path == "/login"


@pytest.mark.parametrize("disabled_user_keys", ["keep", "revoke"])
async def test_disabling_a_provider_account_keeps_or_revokes_its_keys_as_the_setting_says(
    sso: Sso, client: aiohttp.ClientSession, disabled_user_keys: str
) -> None:
    await sign_in_at_provider(client, "ada")
    page = await client.post(
        "/profile/keys", data={"name": "laptop", "csrf": csrf_of(await (await client.get("/profile")).text())}
    )
    plaintext = re.search(r"(sk-[A-Za-z0-9_-]+)", await page.text())
    assert plaintext is not None
    ada = await get_user_by_email(sso.site.store, "ada@example.com")
    assert ada is not None
    async with _browser(sso) as admin:
        await sign_in_at_provider(admin, "root")
        csrf = csrf_of(await (await admin.get("/admin/users")).text())
        done = await admin.post(f"/admin/users/{ada.id}/disable", data={"csrf": csrf})
        assert done.status == 200
    key = await find_key(sso.site.store, hash_key(plaintext.group(1)))
    assert key is not None and (key.revoked_at is None) == (disabled_user_keys == "keep")
    # And the provider signing ada in again does not bring the account back.
    async with _browser(sso) as again:
        response = await sign_in_at_provider(again, "ada")
        assert response.status == 403 and "is disabled" in await _page_error(response)


async def test_chromium_signs_in_through_the_provider_and_out_of_both(sso: Sso, chromium: Page) -> None:
    p = chromium
    errors: list[str] = []
    p.on("pageerror", lambda error: errors.append(str(error)))
    await p.goto(f"{sso.site.url}/admin/users")
    await p.click("text=Sign in with your organisation")
    await p.wait_for_url(f"{sso.idp.issuer}/interaction/**")
    await p.fill("input[name=login]", "root")
    await p.fill("input[name=password]", "anything")
    await p.click("button[type=submit]")
    # The provider's consent page, then back to the page that asked.
    await p.click("button[type=submit]")
    await p.wait_for_url(f"{sso.site.url}/admin/users")
    assert "root@example.com" in await p.content()
    cookies = {c["name"]: c for c in await p.context.cookies(sso.site.url)}
    assert cookies["llmgw_session"]["httpOnly"] is True and "llmgw_oidc" not in cookies
    await p.click("button >> text=Log out")
    await p.wait_for_url(f"{sso.idp.issuer}/session/end**")
    await p.click("button[type=submit] >> nth=0")
    await p.wait_for_url(f"{sso.site.url}/login")
    assert errors == []


async def test_a_nonce_other_than_the_one_sent_is_refused_in_words(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    started = await client.get("/login/oidc", allow_redirects=False)
    # The browser's record of the sign-in now names another nonce than the one the provider was sent.
    flow = Flow.from_cookie(started.cookies[FLOW_COOKIE].value)
    assert flow is not None
    forged = attrs.evolve(flow, nonce="another-nonce").cookie()
    client.cookie_jar.update_cookies({FLOW_COOKIE: forged}, URL(sso.site.url))
    response = await through_provider(client, await client.get(started.headers["Location"]), "ada")
    assert response.status == 401
    assert "nonce is not the one this sign-in sent" in await _page_error(response)


async def test_an_id_token_signed_by_a_key_the_provider_does_not_publish_under_its_name_is_refused(
    sso: Sso,
) -> None:
    async with _browser(sso) as first:
        assert (await sign_in_at_provider(first, "ada")).url.path == "/profile"
    # Another key under the name ("first") of the key this server fetched: its tokens do not verify.
    await sso.idp.rotate("first")
    async with _browser(sso) as second:
        response = await sign_in_at_provider(second, "ada")
        assert response.status == 401
        assert "not signed by any of the provider's keys" in await _page_error(response)


async def test_an_answer_longer_than_any_providers_is_not_read_to_its_end() -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b'{"issuer": "' + b"x" * (MAX_ANSWER + 10) + b'"}')

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", endless)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        issuer = str(server.make_url("")).rstrip("/")
        provider = Provider(_oidc(issuer, "http://127.0.0.1:2"), "secret")
        with pytest.raises(OidcError, match=r"discovery document .* is not JSON \(or over 1 MiB\)"):
            await provider.metadata()
    finally:
        await server.close()


async def test_the_providers_token_judged_after_its_expiry_and_the_skew_is_refused(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    assert sso.site.ctx.oidc is not None
    # oidc-provider's ID tokens last an hour: judged two hours on, this one has expired.
    sso.site.ctx.oidc.clock = lambda: time.time() + 7200
    response = await sign_in_at_provider(client, "ada")
    assert response.status == 401
    assert re.search(r"the ID token expired \d+ s ago; sign in again", await _page_error(response))


async def _signed_in_afresh(sso: Sso, login: str) -> User:
    """Sign login in through the provider in a browser of its own; the account as it then is."""
    async with _browser(sso) as browser:
        response = await sign_in_at_provider(browser, login)
        assert response.url.path == "/profile", await _page_error(response)
    user = await get_user_by_email(sso.site.store, sso.idp.users[login]["email"])  # type: ignore[arg-type]
    assert user is not None
    return user


_TEAMS = {"llm-admins": "admin", "ml-team": "team:ml", "everyone": "org:acme"}


@pytest.mark.parametrize("oidc_changes", [{"groups": _TEAMS}])
async def test_a_group_mapped_to_a_team_makes_a_member_of_a_project_in_it_until_taken_out(sso: Sso) -> None:
    store = sso.site.store
    hierarchy = await load_hierarchy(store)
    vision = await create_project(store, hierarchy.team_id("ml"), "vision")
    elsewhere = await create_project(store, DEFAULT_TEAM_ID, "elsewhere")
    # In the team: in its oldest project.
    ada = await _signed_in_afresh(sso, "ada")
    assert ada.project_id == sso.research and not ada.is_admin
    # Put in another project of the team by an administrator: the groups still hold, so it stays.
    await approve_user(store, ada.id, vision.id)
    assert (await _signed_in_afresh(sso, "ada")).project_id == vision.id
    # Put outside the team: the next sign-in brings the account back into it.
    await approve_user(store, ada.id, elsewhere.id)
    assert (await _signed_in_afresh(sso, "ada")).project_id == sso.research
    # Taken out of the team's group at the provider: out of the team at the next sign-in.
    sso.idp.set_user("ada", "ada@example.com", ["llm-admins"])
    ada = await _signed_in_afresh(sso, "ada")
    assert ada.project_id is None and ada.is_admin and ada.groups == ("llm-admins",)


@pytest.mark.parametrize("oidc_changes", [{"groups": _TEAMS}])
async def test_a_group_mapped_to_an_organisation_makes_a_member_of_a_project_in_it(sso: Sso) -> None:
    # An existing local account, in the default organisation's project: older, but not in acme.
    assert (await sso.site.user("bob@example.com")).project_id == DEFAULT_PROJECT_ID
    sso.idp.set_user("bob", "bob@example.com", ["everyone"])
    bob = await _signed_in_afresh(sso, "bob")
    assert bob.project_id == sso.research
    sso.idp.set_user("bob", "bob@example.com", ["everyone", "llm-admins"])
    assert (await _signed_in_afresh(sso, "bob")).project_id == sso.research


@pytest.mark.parametrize(
    "oidc_changes", [{"groups": {"second": "project:vision", "first": "project:research"}}]
)
async def test_a_person_in_several_mapped_groups_joins_the_project_listed_first_in_the_setting(
    sso: Sso,
) -> None:
    hierarchy = await load_hierarchy(sso.site.store)
    vision = await create_project(sso.site.store, hierarchy.team_id("ml"), "vision")
    # The token lists "first" first; the setting lists "second" first, and the setting decides.
    sso.idp.set_user("ada", "ada@example.com", ["first", "second"])
    assert (await _signed_in_afresh(sso, "ada")).project_id == vision.id


@pytest.mark.parametrize("oidc_changes", [{"groups": {"ml-team": "team:empty", "llm-admins": "admin"}}])
async def test_a_group_mapped_to_a_team_with_no_project_yet_signs_in_to_no_project(sso: Sso) -> None:
    await create_team(sso.site.store, (await load_hierarchy(sso.site.store)).org_id("acme"), "empty")
    # In the default project before: outside the team, so no longer in it.
    await approve_user(sso.site.store, (await sso.site.user("ada@example.com")).id, DEFAULT_PROJECT_ID)
    ada = await _signed_in_afresh(sso, "ada")
    assert ada.project_id is None and ada.active


@pytest.mark.parametrize("oidc_changes", [{"groups": {"ml-team": "team:no-such-team"}}])
async def test_a_mapping_to_a_team_this_server_does_not_have_is_refused_in_words(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_provider(client, "ada")
    assert response.status == 401
    error = await _page_error(response)
    assert "auth.oidc.groups gives 'ml-team' 'team:no-such-team', which this server does not have" in error
    assert "there is no team 'no-such-team'" in error


async def test_a_person_taken_out_of_every_mapped_group_loses_role_and_project_at_the_refused_sign_in(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    await sign_in_at_provider(client, "root")
    assert (await client.get("/admin/users")).status == 200
    sso.idp.set_user("root", "root@example.com", ["marketing"])
    async with _browser(sso) as again:
        assert (await sign_in_at_provider(again, "root")).status == 401
    root = await get_user_by_email(sso.site.store, "root@example.com")
    assert root is not None
    assert not root.is_admin and root.project_id is None and root.groups == ("marketing",)
    # The session made while still in the groups is no administrator's any more either.
    assert (await client.get("/admin/users")).status == 403


async def test_a_person_the_provider_no_longer_lets_in_keeps_no_session_past_its_expiry(
    sso: Sso, client: aiohttp.ClientSession
) -> None:
    response = await sign_in_at_provider(client, "ada")
    made = next(step for step in response.history if step.url.path == "/login/oidc/callback")
    ttl = int(sso.site.ctx.cfg.auth.session_ttl_s)
    assert made.cookies[SESSION_COOKIE]["max-age"] == str(ttl)
    row = await sso.site.store.fetch_one("SELECT created_at, expires_at FROM sessions")
    assert row is not None
    lasts = datetime.fromisoformat(row["expires_at"]) - datetime.fromisoformat(row["created_at"])
    assert lasts.total_seconds() == ttl
    sso.idp.set_user("ada", "ada@example.com", ["marketing"])
    # Its end comes (moved there rather than waited for): the pages ask for a sign-in, which is refused.
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    async with sso.site.store.transaction() as db:
        await db.execute("UPDATE sessions SET expires_at = ?", (past,))
    assert (await client.get("/profile", allow_redirects=False)).status == 303
    assert (await sign_in_at_provider(client, "ada")).status == 401
    assert (await client.get("/profile", allow_redirects=False)).status == 303


def test_a_server_loads_the_token_library_only_when_it_reads_a_token() -> None:
    """joserfc's modules held 1.5 MB of every server's memory, with OIDC configured or not."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, llmgw.cli.main, llmgw.roles.server, llmgw.web.app, llmgw.web.oidc_pages;"
            "print(sorted({m.split('.')[0] for m in sys.modules}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "'llmgw'" in loaded
    assert "joserfc" not in loaded
