"""The pages on the client port: sign-up, login, logout, profile, admin; cookie flags and CSRF."""

from __future__ import annotations

import html
import importlib
import re
from datetime import UTC, datetime
from http.cookies import SimpleCookie

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from llmgw.store.keys import list_keys
from llmgw.store.scopes import create_project
from llmgw.store.sessions import lookup_session
from llmgw.store.usage import UsageKey, UsageTotals, add_usage
from llmgw.store.users import authenticate, get_user, get_user_by_email
from llmgw.web.app import mount_sign_in
from llmgw.web.guards import require_admin
from llmgw.web.render import render

from .conftest import PASSWORD, Site, browser, csrf_of, login, nav_links

Client = aiohttp.ClientSession

NASTY = '\'); DROP TABLE api_keys;-- <script>alert("x")</script> & <b>bold</b>'
NASTY_EMAIL = "o'brien\";--<script>alert(1)</script>&amp;@example.com"


def _set_cookies(response: web.StreamResponse | object) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in response.headers.getall("Set-Cookie", []):  # type: ignore[attr-defined]
        jar.load(header)
    return jar


class TestCookies:
    async def test_the_session_cookie_is_httponly_samesite_lax_and_scoped_to_the_site(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        page = await client.get("/login")
        response = await client.post(
            "/login",
            data={"email": "ann@example.com", "password": PASSWORD, "csrf": csrf_of(await page.text())},
            allow_redirects=False,
        )
        assert response.status == 303
        cookie = _set_cookies(response)["llmgw_session"]
        assert cookie["httponly"] is True
        assert cookie["samesite"] == "Lax"
        assert cookie["path"] == "/"
        assert not cookie["secure"], "over plain HTTP a Secure cookie would never come back"

    async def test_behind_a_tls_proxy_the_session_cookie_is_also_secure(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        page = await client.get("/login")
        response = await client.post(
            "/login",
            data={"email": "ann@example.com", "password": PASSWORD, "csrf": csrf_of(await page.text())},
            headers={"X-Forwarded-Proto": "https"},
            allow_redirects=False,
        )
        assert _set_cookies(response)["llmgw_session"]["secure"] is True

    async def test_the_login_forms_csrf_cookie_is_httponly_and_samesite_lax(self, client: Client) -> None:
        cookie = _set_cookies(await client.get("/login"))["llmgw_csrf"]
        assert cookie["httponly"] is True and cookie["samesite"] == "Lax"


class TestCsrf:
    async def test_every_form_on_every_page_carries_a_csrf_token(self, site: Site, client: Client) -> None:
        await site.user("root@example.com", admin=True)
        await site.user("pending@example.com", status="pending")
        pages = ["/login", "/signup"]
        for path in pages:
            text = await (await client.get(path)).text()
            assert text.count("<form") == text.count('name="csrf"') > 0, path
        await login(client, "root@example.com")
        for path in ("/profile", "/admin/users", "/admin/quotas"):
            text = await (await client.get(path)).text()
            posts = text.count('method="post"')
            assert posts > 0 and text.count('name="csrf"') == posts, path

    async def test_a_login_without_the_forms_token_is_refused(self, site: Site, client: Client) -> None:
        await site.user("ann@example.com")
        await client.get("/login")
        response = await client.post("/login", data={"email": "ann@example.com", "password": PASSWORD})
        assert response.status == 403
        assert "CSRF token is missing or stale" in await response.text()
        assert "llmgw_session" not in _set_cookies(response)

    async def test_a_signed_in_post_with_a_wrong_token_changes_nothing(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        await login(client, "ann@example.com")
        for token in ("", "forged"):
            response = await client.post("/profile/keys", data={"name": "ci", "csrf": token})
            assert response.status == 403
        assert await list_keys(site.store) == []

    async def test_a_post_from_a_page_of_another_session_is_refused(self, site: Site, client: Client) -> None:
        await site.user("ann@example.com")
        other_token = await login(client, "ann@example.com")
        async with browser(site) as second:
            await login(second, "ann@example.com")
            response = await second.post("/profile/keys", data={"name": "ci", "csrf": other_token})
            assert response.status == 403


class TestLogin:
    async def test_a_wrong_password_is_refused_without_saying_which_part_was_wrong(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        page = await client.get("/login")
        csrf = csrf_of(await page.text())
        for email, password in (("ann@example.com", "wrong password"), ("nobody@example.com", PASSWORD)):
            response = await client.post("/login", data={"email": email, "password": password, "csrf": csrf})
            assert response.status == 401 and "Wrong email or password." in await response.text()

    async def test_a_pending_account_is_told_it_waits_for_approval(self, site: Site, client: Client) -> None:
        await site.user("new@example.com", status="pending")
        page = await client.get("/login")
        response = await client.post(
            "/login",
            data={"email": "new@example.com", "password": PASSWORD, "csrf": csrf_of(await page.text())},
        )
        assert response.status == 401
        assert "waiting for an administrator to approve it" in await response.text()

    async def test_a_page_that_needs_a_login_sends_there_and_back(self, site: Site, client: Client) -> None:
        await site.user("ann@example.com")
        response = await client.get("/profile", allow_redirects=False)
        assert response.status == 303 and response.headers["Location"] == "/login?next=/profile"
        page = await client.get("/login?next=/profile")
        back = await client.post(
            "/login",
            data={
                "email": "ann@example.com",
                "password": PASSWORD,
                "next": "/profile",
                "csrf": csrf_of(await page.text()),
            },
            allow_redirects=False,
        )
        assert back.headers["Location"] == "/profile"

    async def test_next_never_sends_a_person_to_another_site(self, site: Site) -> None:
        await site.user("ann@example.com")
        for target in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
            async with browser(site) as client:
                page = await client.get("/login")
                response = await client.post(
                    "/login",
                    data={
                        "email": "ann@example.com",
                        "password": PASSWORD,
                        "next": target,
                        "csrf": csrf_of(await page.text()),
                    },
                    allow_redirects=False,
                )
                assert response.headers["Location"] == "/profile", target

    async def test_a_next_holding_a_line_break_is_ignored_not_a_dropped_connection(self, site: Site) -> None:
        """A CR/LF in next was a ValueError writing the Location header: the reply never came."""
        await site.user("ann@example.com")
        for target in ("/profile\r\nSet-Cookie: x=1", "/profile\n", "/admin\x7f", "/\t/evil.example"):
            async with browser(site) as client:
                page = await client.get("/login")
                response = await client.post(
                    "/login",
                    data={
                        "email": "ann@example.com",
                        "password": PASSWORD,
                        "next": target,
                        "csrf": csrf_of(await page.text()),
                    },
                    allow_redirects=False,
                )
                assert (response.status, response.headers["Location"]) == (303, "/profile"), target
                # Signed in, /login leads to next at once.
                again = await client.get("/login", params={"next": target}, allow_redirects=False)
                assert (again.status, again.headers["Location"]) == (303, "/profile"), target

    async def test_logout_ends_the_session_so_its_cookie_no_longer_signs_in(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        csrf = await login(client, "ann@example.com")
        token = client.cookie_jar.filter_cookies(URL(site.url))["llmgw_session"].value
        response = await client.post("/logout", data={"csrf": csrf}, allow_redirects=False)
        assert response.status == 303 and response.headers["Location"] == "/login"
        assert await lookup_session(site.store, token) is None
        assert (await client.get("/profile", allow_redirects=False)).status == 303

    async def test_v1_routes_never_look_up_a_session(
        self, site: Site, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        await site.user("ann@example.com")
        await login(client, "ann@example.com")

        async def no_lookup(*args: object) -> None:
            raise AssertionError("a /v1 request looked up a session")

        monkeypatch.setattr("llmgw.web.sessions.lookup_session", no_lookup)
        response = await client.get("/v1/models")
        assert response.status == 401  # auth is on and no key was sent: the gateway's own answer


class TestSignup:
    async def test_a_sign_up_makes_a_pending_account_an_admin_then_approves(
        self, site: Site, client: Client
    ) -> None:
        page = await client.get("/signup")
        response = await client.post(
            "/signup",
            data={
                "email": "new@example.com",
                "password": PASSWORD,
                "password2": PASSWORD,
                "csrf": csrf_of(await page.text()),
            },
        )
        assert (
            response.status == 200 and "waiting for an administrator to approve it" in await response.text()
        )
        user = await get_user_by_email(site.store, "new@example.com")
        assert user is not None and user.status == "pending"

    async def test_two_different_passwords_are_refused_keeping_the_email(self, client: Client) -> None:
        page = await client.get("/signup")
        response = await client.post(
            "/signup",
            data={
                "email": "new@example.com",
                "password": PASSWORD,
                "password2": PASSWORD + "x",
                "csrf": csrf_of(await page.text()),
            },
        )
        text = await response.text()
        assert (
            response.status == 400
            and "The two passwords differ." in text
            and 'value="new@example.com"' in text
        )

    @pytest.mark.parametrize("signup_open", [False])
    async def test_when_sign_up_is_closed_the_page_says_so(self, site: Site, client: Client) -> None:
        response = await client.get("/signup")
        assert response.status == 404 and "does not take sign-ups" in await response.text()
        posted = await client.post("/signup", data={"email": "x@example.com", "password": PASSWORD})
        assert posted.status == 404
        assert await get_user_by_email(site.store, "x@example.com") is None


class TestProfile:
    async def test_a_key_made_on_the_profile_is_shown_once_and_then_only_by_prefix(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        csrf = await login(client, "ann@example.com")
        response = await client.post("/profile/keys", data={"name": "laptop", "csrf": csrf})
        text = await response.text()
        (record,) = await list_keys(site.store)
        assert "shown only this once" in text and record.prefix in text
        plaintext = text.split('id="new-key">')[1].split("<")[0]
        assert plaintext.startswith(record.prefix) and len(plaintext) > 40
        again = await (await client.get("/profile")).text()
        assert record.prefix in again and plaintext not in again

    @pytest.mark.parametrize("name", ["two\nlines", "x" * 101, "  "])
    async def test_a_key_name_that_would_break_a_listing_is_refused_on_the_page(
        self, site: Site, client: Client, name: str
    ) -> None:
        await site.user("ann@example.com")
        csrf = await login(client, "ann@example.com")
        response = await client.post("/profile/keys", data={"name": name, "csrf": csrf})
        assert response.status == 400
        text = await response.text()
        assert "is not allowed; a key name is printable characters" in text or "A key needs a name" in text
        assert await list_keys(site.store) == []

    async def test_a_person_revokes_their_own_key_but_not_anothers(self, site: Site, client: Client) -> None:
        await site.user("ann@example.com")
        await site.user("bob@example.com")
        csrf = await login(client, "ann@example.com")
        await client.post("/profile/keys", data={"name": "anns", "csrf": csrf})
        (anns,) = await list_keys(site.store)
        async with browser(site) as bob:
            bob_csrf = await login(bob, "bob@example.com")
            refused = await bob.post(f"/profile/keys/{anns.id}/revoke", data={"csrf": bob_csrf})
            assert refused.status == 403 and "is not one of yours" in await refused.text()
        assert (await list_keys(site.store))[0].revoked_at is None
        await client.post(f"/profile/keys/{anns.id}/revoke", data={"csrf": csrf})
        assert (await list_keys(site.store))[0].revoked_at is not None

    async def test_a_person_sees_the_usage_of_their_own_keys_and_no_one_elses(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        await site.user("bob@example.com")
        csrf = await login(client, "ann@example.com")
        before = await (await client.get("/profile")).text()
        assert "No requests with your keys in the last" in before
        await client.post("/profile/keys", data={"name": "anns", "csrf": csrf})
        async with browser(site) as bob:
            await bob.post(
                "/profile/keys", data={"name": "bobs", "csrf": await login(bob, "bob@example.com")}
            )
        anns, bobs = await list_keys(site.store)
        today = datetime.now(UTC).date().isoformat()
        await add_usage(
            site.store,
            [
                (UsageKey(today, anns.id, 1, "sim-chat", 200), UsageTotals(3, 120, 45, 0.25, 30.0)),
                (UsageKey(today, anns.id, 1, "sim-chat", 429), UsageTotals(1, 0, 0, 0.0, 1.0)),
                (UsageKey(today, bobs.id, 1, "sim-bob", 200), UsageTotals(7, 999, 888, 9.0, 70.0)),
            ],
        )
        text = await (await client.get("/profile")).text()
        table = text.split('<table id="usage">')[1].split("</table>")[0]
        cells = re.findall(r"<td>([^<]*)</td>", table)
        assert cells == [today, "sim-chat", "4", "120", "45", "0.2500"]
        assert "sim-bob" not in text and "999" not in text

    async def test_changing_the_password_needs_the_current_one_and_signs_out_other_sessions(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        csrf = await login(client, "ann@example.com")
        async with browser(site) as elsewhere:
            await login(elsewhere, "ann@example.com")
            wrong = await client.post(
                "/profile/password",
                data={
                    "current": "nope",
                    "password": "new password 1",
                    "password2": "new password 1",
                    "csrf": csrf,
                },
            )
            assert wrong.status == 400 and "The current password is wrong." in await wrong.text()
            response = await client.post(
                "/profile/password",
                data={
                    "current": PASSWORD,
                    "password": "new password 1",
                    "password2": "new password 1",
                    "csrf": csrf,
                },
            )
            assert response.status == 200 and "Your password is changed" in await response.text()
            assert (await elsewhere.get("/profile", allow_redirects=False)).status == 303
        assert (await client.get("/profile", allow_redirects=False)).status == 200
        assert await authenticate(site.store, "ann@example.com", "new password 1") is not None


class TestAdmin:
    async def test_a_person_who_is_not_an_administrator_is_refused_the_admin_pages(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        csrf = await login(client, "ann@example.com")
        for path in ("/admin/users", "/admin/quotas", "/admin/usage"):
            response = await client.get(path)
            assert response.status == 403 and "is for administrators" in await response.text(), path
        response = await client.post("/admin/users/1/promote", data={"csrf": csrf})
        assert response.status == 403
        user = await get_user_by_email(site.store, "ann@example.com")
        assert user is not None and not user.is_admin

    async def test_the_admin_navigation_lists_only_the_pages_this_app_mounted(
        self, site: Site, client: Client
    ) -> None:
        """The cluster pages' module, once imported, no longer adds links to an app that lacks them."""
        importlib.import_module("llmgw.web.cluster")
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        nav = await nav_links(client, "/admin/users")
        assert nav == [
            ("/profile", "Profile"),
            ("/admin/users", "Users"),
            ("/admin/projects", "Projects"),
            ("/admin/quotas", "Quotas"),
            ("/admin/usage", "Usage"),
        ]

    async def test_an_admin_approves_promotes_and_disables_from_the_users_page(
        self, site: Site, client: Client
    ) -> None:
        await site.user("root@example.com", admin=True)
        pending = await site.user("new@example.com", status="pending")
        csrf = await login(client, "root@example.com")
        project = await create_project(site.store, 1, "research")
        response = await client.post(
            f"/admin/users/{pending.id}/approve", data={"project": str(project.id), "csrf": csrf}
        )
        assert "new@example.com is approved into project &#39;research&#39;" in await response.text()
        await client.post(f"/admin/users/{pending.id}/promote", data={"csrf": csrf})
        user = await get_user(site.store, pending.id)
        assert user is not None and user.active and user.is_admin and user.project_id == project.id
        response = await client.post(f"/admin/users/{pending.id}/disable", data={"csrf": csrf})
        assert "signed out everywhere" in await response.text()
        user = await get_user(site.store, pending.id)
        assert user is not None and user.status == "disabled"

    async def test_a_disabled_person_is_signed_out_at_once(self, site: Site, client: Client) -> None:
        await site.user("root@example.com", admin=True)
        ann = await site.user("ann@example.com")
        csrf = await login(client, "root@example.com")
        async with browser(site) as anns:
            await login(anns, "ann@example.com")
            await client.post(f"/admin/users/{ann.id}/disable", data={"csrf": csrf})
            assert (await anns.get("/profile", allow_redirects=False)).status == 303

    async def test_the_flash_after_an_action_cannot_be_written_by_a_link(
        self, site: Site, client: Client
    ) -> None:
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        text = await (await client.get("/admin/users?done=Your+session+expired,+go+to+evil.example")).text()
        assert "evil.example" not in text


class TestVerbatimNames:
    async def test_names_full_of_sql_and_html_are_stored_and_shown_verbatim_escaped(
        self, site: Site, client: Client
    ) -> None:
        project = await create_project(site.store, 1, NASTY)
        await site.user("root@example.com", admin=True)
        page = await client.get("/signup")
        await client.post(
            "/signup",
            data={
                "email": NASTY_EMAIL,
                "password": PASSWORD,
                "password2": PASSWORD,
                "csrf": csrf_of(await page.text()),
            },
        )
        user = await get_user_by_email(site.store, NASTY_EMAIL)
        assert user is not None and user.email == NASTY_EMAIL
        csrf = await login(client, "root@example.com")
        await client.post(f"/admin/users/{user.id}/approve", data={"project": str(project.id), "csrf": csrf})
        await client.post("/profile/keys", data={"name": NASTY, "csrf": csrf})
        assert [k.name for k in await list_keys(site.store)] == [NASTY]
        for path in ("/admin/users", "/admin/quotas", "/profile"):
            text = await (await client.get(path)).text()
            assert "<script>" not in text and "<b>bold</b>" not in text, path
            # Escaped in the page, the very same text once the browser reads it.
            assert NASTY in html.unescape(text), path
        users_page = await (await client.get("/admin/users")).text()
        assert NASTY_EMAIL in html.unescape(users_page) and NASTY_EMAIL not in users_page


class TestRequireAdminElsewhere:
    async def test_another_app_guards_its_pages_with_require_admin_and_the_same_sign_in(
        self, site: Site
    ) -> None:
        """What the admin listener does: mount_sign_in, then @require_admin on its own handlers."""

        @require_admin
        async def cluster(request: web.Request) -> web.StreamResponse:
            return await render(request, "message.html", title="Cluster", message="nodes")

        app = web.Application()
        mount_sign_in(app, site.ctx)
        app.router.add_get("/admin/cluster", cluster)
        app.router.add_post("/admin/cluster", cluster)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            await site.user("root@example.com", admin=True)
            await site.user("ann@example.com")
            url = str(server.make_url("/")).rstrip("/")
            for email, status in (("ann@example.com", 403), ("root@example.com", 200)):
                async with aiohttp.ClientSession(
                    base_url=url, cookie_jar=aiohttp.CookieJar(unsafe=True)
                ) as c:
                    first = await c.get("/admin/cluster", allow_redirects=False)
                    assert first.headers["Location"] == "/login?next=/admin/cluster"
                    page = await c.get("/login?next=/admin/cluster")
                    response = await c.post(
                        "/login",
                        data={
                            "email": email,
                            "password": PASSWORD,
                            "next": "/admin/cluster",
                            "csrf": csrf_of(await page.text()),
                        },
                    )
                    assert response.status == status and str(response.url).endswith("/admin/cluster")
                    if status == 200:
                        text = await response.text()
                        assert "nodes" in text
                        csrf = csrf_of(text)
                        assert (await c.post("/admin/cluster", data={"csrf": "forged"})).status == 403
                        assert (await c.post("/admin/cluster", data={"csrf": csrf})).status == 200
        finally:
            await server.close()
