"""Failed sign-ins are throttled per email and per address, the same for emails with no account, and shown."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
import structlog

from llmgw.web import logins as throttle
from llmgw.web.logins import LoginThrottle

from .conftest import PASSWORD, Site, browser, csrf_of, login

Client = aiohttp.ClientSession


class _Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def logins(clock: _Clock) -> LoginThrottle:
    return LoginThrottle(clock=clock)


async def _try(
    client: Client, email: str, password: str, address: str = "203.0.113.7"
) -> aiohttp.ClientResponse:
    page = await client.get("/login")
    response = await client.post(
        "/login",
        data={"email": email, "password": password, "csrf": csrf_of(await page.text())},
        headers={"X-Forwarded-For": address},
        allow_redirects=False,
    )
    await response.read()
    return response


async def _fail(client: Client, email: str, times: int, address: str = "203.0.113.7") -> None:
    for _ in range(times):
        assert (await _try(client, email, "wrong password", address)).status == 401


_TOKEN = re.compile(r'name="csrf" value="[^"]+"')


def _page(text: str, email: str) -> str:
    """The page with what differs by nature between two answers taken out: the form's token, the email."""
    return _TOKEN.sub("", text).replace(email, "EMAIL")


class TestThrottling:
    async def test_twenty_wrong_passwords_at_once_are_checked_five_times_and_refused_fifteen(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        answers = await asyncio.gather(*(_try(client, "ann@example.com", f"wrong {n}") for n in range(20)))
        statuses = sorted(a.status for a in answers)
        assert statuses == [401] * throttle.ACCOUNT_FREE + [429] * (20 - throttle.ACCOUNT_FREE)
        for refused in (a for a in answers if a.status == 429):
            assert int(refused.headers["Retry-After"]) >= 1

    async def test_an_email_with_no_account_is_answered_exactly_as_one_with(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        answers = {}
        for email in ("ann@example.com", "nobody@example.com"):
            # Each from its own address, so that only the email's own count decides.
            address = "198.51.100.1" if email.startswith("ann") else "198.51.100.2"
            wrong = [
                await _try(client, email, "wrong password", address) for _ in range(throttle.ACCOUNT_FREE)
            ]
            refused = await _try(client, email, "wrong password", address)
            answers[email] = [
                (r.status, r.headers.get("Retry-After"), _page(await r.text(), email))
                for r in (*wrong, refused)
            ]
        assert answers["ann@example.com"] == answers["nobody@example.com"]
        assert answers["ann@example.com"][-1][:2] == (429, "1")
        assert "Too many failed sign-ins" in answers["ann@example.com"][-1][2]

    async def test_the_right_password_is_refused_until_the_lockout_expires(
        self, site: Site, client: Client, clock: _Clock
    ) -> None:
        await site.user("ann@example.com")
        await _fail(client, "ann@example.com", throttle.ACCOUNT_FREE)
        locked = await _try(client, "ann@example.com", PASSWORD)
        assert locked.status == 429
        wait = int(locked.headers["Retry-After"])
        clock.now += wait - 0.5
        assert (await _try(client, "ann@example.com", PASSWORD)).status == 429
        clock.now += 0.5
        signed_in = await _try(client, "ann@example.com", PASSWORD)
        assert signed_in.status == 303 and signed_in.headers["Location"] == "/profile"

    async def test_each_further_failure_locks_the_email_out_twice_as_long(
        self, site: Site, client: Client, clock: _Clock
    ) -> None:
        await _fail(client, "Ann@Example.com", throttle.ACCOUNT_FREE)
        waits = []
        for _ in range(4):
            refused = await _try(client, "ann@example.com", "wrong password")
            assert refused.status == 429, "the email is counted without regard to case"
            waits.append(int(refused.headers["Retry-After"]))
            clock.now += waits[-1]
            assert (await _try(client, "ann@example.com", "wrong password")).status == 401
        assert waits == [1, 2, 4, 8]

    async def test_an_address_guessing_at_many_emails_is_locked_out_of_all_of_them(
        self, site: Site, client: Client
    ) -> None:
        await site.user("ann@example.com")
        for n in range(throttle.ADDRESS_FREE):
            await _fail(client, f"guess{n}@example.com", 1, address="192.0.2.9")
        assert (await _try(client, "ann@example.com", PASSWORD, address="192.0.2.9")).status == 429
        # Another address is not held back by it.
        assert (await _try(client, "ann@example.com", PASSWORD, address="192.0.2.10")).status == 303

    async def test_a_successful_sign_in_clears_the_emails_count(self, site: Site, client: Client) -> None:
        await site.user("ann@example.com")
        await _fail(client, "ann@example.com", throttle.ACCOUNT_FREE - 1)
        assert (await _try(client, "ann@example.com", PASSWORD)).status == 303
        async with browser(site) as other:
            await _fail(other, "ann@example.com", throttle.ACCOUNT_FREE - 1)

    async def test_the_current_password_on_the_profile_is_throttled_too(
        self, site: Site, client: Client
    ) -> None:
        """Whoever holds a stolen session must not guess the password at scrypt's pace."""
        await site.user("ann@example.com")
        csrf = await login(client, "ann@example.com")
        statuses = []
        for _ in range(throttle.ACCOUNT_FREE + 1):
            response = await client.post(
                "/profile/password",
                data={
                    "current": "wrong",
                    "password": "another long one",
                    "password2": "another long one",
                    "csrf": csrf,
                },
            )
            statuses.append(response.status)
            await response.read()
        assert statuses == [400] * throttle.ACCOUNT_FREE + [429]
        assert response.headers["Retry-After"] == "1"


class TestTheAdministratorsPage:
    async def test_recent_failures_are_listed_newest_first_with_email_and_address(
        self, site: Site, client: Client
    ) -> None:
        await site.user("root@example.com", admin=True)
        async with browser(site) as attacker:
            await _fail(attacker, "<b>ann</b>@example.com", throttle.ACCOUNT_FREE, address="192.0.2.77")
            assert (
                await _try(attacker, "<b>ann</b>@example.com", "again", address="192.0.2.77")
            ).status == 429
        await login(client, "root@example.com")
        page = await (await client.get("/admin/users")).text()
        section = page[page.index('id="failed-logins"') :]
        rows = re.findall(
            r"<tr>\s*<td>[^<]*</td>\s*<td class=\"email\">([^<]*)</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>",
            section,
        )
        assert len(rows) == throttle.ACCOUNT_FREE + 1
        assert rows[0] == (
            "&lt;b&gt;ann&lt;/b&gt;@example.com",
            "192.0.2.77",
            "refused: locked for another 1 s",
        )
        assert rows[1][2] == "wrong email or password; locked for 1 s"
        assert rows[-1][2] == "wrong email or password"
        assert "<b>ann</b>" not in page

    async def test_failed_sign_ins_are_logged(self, site: Site, client: Client) -> None:
        with structlog.testing.capture_logs() as logged:
            await _fail(client, "Ann@example.com", 1, address="192.0.2.5")
        assert {
            "event": "failed sign-in",
            "email": "ann@example.com",
            "address": "192.0.2.5",
            "outcome": "wrong email or password",
            "log_level": "warning",
        } in logged
