"""The admin pages in a real headless Chromium: sign in, approve, promote, disable, edit a quota, see usage.

Driven by Playwright for Python against Debian's chromium (`make test` installs it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
from playwright.async_api import async_playwright

from llmgw.store.quotas import list_limits
from llmgw.store.scopes import Scope, create_project
from llmgw.store.usage import UsageKey, UsageTotals, add_usage
from llmgw.store.users import get_user
from tests import needs

from .conftest import PASSWORD, Site

if TYPE_CHECKING:
    from playwright.async_api import Page

NASTY_PROJECT = "'); DROP TABLE projects;-- <script>alert('p')</script> & <i>x</i>"
NASTY_EMAIL = "o'brien\";--<img/src=x/onerror=alert(1)>&amp;@example.com"


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=needs.program("chromium", "chromium"),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            context = await browser.new_context()
            yield await context.new_page()
        finally:
            await browser.close()


async def test_an_admin_runs_the_users_quotas_and_usage_pages_in_a_real_browser(
    site: Site, page: Page
) -> None:
    p = page
    dialogs: list[str] = []
    p.on("dialog", lambda dialog: dialogs.append(dialog.message))
    errors: list[str] = []
    p.on("pageerror", lambda error: errors.append(str(error)))

    await site.user("root@example.com", admin=True)
    pending = await site.user(NASTY_EMAIL, status="pending")
    project = await create_project(site.store, 1, NASTY_PROJECT)
    today = datetime.now(UTC).date().isoformat()
    await add_usage(
        site.store,
        [
            (UsageKey(today, 1, 1, "sim-chat", 200), UsageTotals(3, 300, 120, 0.0, 30.0)),
            (UsageKey(today, 2, project.id, "sim-chat", 200), UsageTotals(1, 40, 2, 0.0, 9.0)),
        ],
    )

    # Signing in: the admin page sends to the login form and back.
    await p.goto(f"{site.url}/admin/users")
    assert p.url.startswith(f"{site.url}/login?next=/admin/users")
    await p.fill("input[name=email]", "root@example.com")
    await p.fill("input[name=password]", PASSWORD)
    await p.click("button[type=submit] >> text=Log in")
    await p.wait_for_url(f"{site.url}/admin/users")
    cookies = {c["name"]: c for c in await p.context.cookies()}
    assert cookies["llmgw_session"]["httpOnly"] is True
    assert cookies["llmgw_session"]["sameSite"] == "Lax"
    # No script on the page can read the session.
    assert "llmgw_session" not in await p.evaluate("document.cookie")

    # The email full of metacharacters reads verbatim.
    row = p.locator(f"#user-{pending.id}")
    assert await row.locator("td.email").text_content() == NASTY_EMAIL
    assert await row.locator("td.status").text_content() == "pending"

    # Approve into the project whose name is full of metacharacters.
    await row.locator("select[name=project]").select_option(str(project.id))
    await row.locator("button >> text=Approve").click()
    await p.wait_for_url("**/admin/users?done=approve*")
    flash = await p.locator(".flash").text_content()
    assert (
        flash == f"{NASTY_EMAIL} is approved into project '{NASTY_PROJECT}' (team 'default', org 'default')."
    )
    assert await row.locator("td.status").text_content() == "active"

    await row.locator("button >> text=Promote").click()
    await p.wait_for_url("**/admin/users?done=promote*")
    await row.locator("button >> text=Disable").click()
    await p.wait_for_url("**/admin/users?done=disable*")
    assert await row.locator("td.status").text_content() == "disabled"
    user = await get_user(site.store, pending.id)
    assert user is not None and user.is_admin and user.status == "disabled" and user.project_id == project.id

    # Quotas: edit the project's row and save.
    await p.click("nav >> text=Quotas")
    quota_row = p.locator(f"#q-project-{project.id}-row")
    assert await quota_row.locator("td.scope").text_content() == (
        f"project '{NASTY_PROJECT}' (team 'default', org 'default')"
    )
    await quota_row.locator("input[name=rpm]").fill("120")
    await quota_row.locator("input[name=tpm]").fill("50000")
    await quota_row.locator("button >> text=Save").click()
    await p.wait_for_url("**/admin/quotas?saved=*")
    limits = {item.scope: item for item in await list_limits(site.store)}
    assert (limits[Scope("project", project.id)].rpm, limits[Scope("project", project.id)].tpm) == (
        120,
        50000,
    )
    assert await quota_row.locator("input[name=rpm]").input_value() == "120"

    # Usage: a bar per project today, drawn on the server.
    await p.click("nav >> text=Usage")
    bars = p.locator("svg.chart rect.bar")
    assert await bars.count() == 2
    box = await p.locator("svg.chart").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100
    legend = await p.locator("#legend").text_content()
    assert f"project '{NASTY_PROJECT}'" in legend and "420 tokens" in legend

    # Logging out ends the session: the admin page asks for a login again.
    await p.click("button >> text=Log out")
    await p.wait_for_url(f"{site.url}/login")
    await p.goto(f"{site.url}/admin/usage")
    assert "/login?next=" in p.url

    # No name ever ran as script.
    assert dialogs == [] and errors == []
