"""The projects page in a real headless Chromium: create an org, a team and a project, add a member,
limit its models, set its quota, and be told why a delete is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest
from playwright.async_api import async_playwright

from llmgw.store.quotas import list_limits
from llmgw.store.scopes import Scope, load_hierarchy
from llmgw.store.users import get_user
from tests import needs

from .conftest import PASSWORD, Site

if TYPE_CHECKING:
    from playwright.async_api import Page

NASTY = "<script>alert('p')</script> & <i>x</i>"


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=needs.program("chromium", "chromium"),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
        )
        try:
            context = await browser.new_context()
            yield await context.new_page()
        finally:
            await browser.close()


async def test_an_admin_creates_a_project_adds_a_member_and_sets_its_quota_in_a_real_browser(
    site: Site, page: Page
) -> None:
    p = page
    dialogs: list[str] = []
    p.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await site.user("root@example.com", admin=True)
    ana = await site.user("ana@example.com", status="pending")

    await p.goto(f"{site.url}/admin/projects")
    await p.fill("input[name=email]", "root@example.com")
    await p.fill("input[name=password]", PASSWORD)
    await p.click("button[type=submit] >> text=Log in")
    await p.wait_for_url(f"{site.url}/admin/projects")

    # An organisation, a team in it and a project in that, named with HTML that must stay text.
    await p.locator("#create-org input[name=name]").fill("acme")
    await p.locator("#create-org button").click()
    await p.wait_for_url("**/admin/projects?done=create*")
    assert await p.locator(".flash").text_content() == "Created org 'acme'."
    await p.locator("#create-team input[name=name]").fill("core")
    await p.locator("#create-team select[name=parent]").select_option(label="acme")
    await p.locator("#create-team button").click()
    await p.wait_for_url("**/admin/projects?done=create*")
    await p.locator("#create-project input[name=name]").fill(NASTY)
    await p.locator("#create-project select[name=parent]").select_option(label="core (acme)")
    await p.locator("#create-project button").click()
    await p.wait_for_url("**/admin/projects?done=create*")
    assert await p.locator(".flash").text_content() == f"Created project '{NASTY}' (team 'core', org 'acme')."
    hierarchy = await load_hierarchy(site.store)
    project_id = hierarchy.project_id(NASTY)
    row = p.locator(f"#project-{project_id}")
    assert await row.locator("td.name").text_content() == NASTY

    # A member: the pending account is approved into the project.
    await row.locator("input[name=user]").fill("ana@example.com")
    await row.locator("button >> text=Add member").click()
    await p.wait_for_url("**/admin/projects?done=member-add*")
    assert "ana@example.com" in (await row.locator("ul.members").text_content() or "")
    member = await get_user(site.store, ana.id)
    assert member is not None and member.status == "active" and member.project_id == project_id

    # Its models.
    await row.locator("input[name=models]").fill("sim-chat")
    await row.locator("button >> text=Save").click()
    await p.wait_for_url("**/admin/projects?done=models*")
    assert (await load_hierarchy(site.store)).projects[project_id].models == ("sim-chat",)

    # Deleting it is refused while it has a member, saying so.
    await row.locator("button >> text=Delete").click()
    assert "still has members ana@example.com" in (await p.locator(".flash.error").text_content() or "")

    # Its quota, on the quotas page, which lists the new project.
    await p.click("nav >> text=Quotas")
    quota_row = p.locator(f"#q-project-{project_id}-row")
    await quota_row.locator("input[name=rpm]").fill("30")
    await quota_row.locator("button >> text=Save").click()
    await p.wait_for_url("**/admin/quotas?saved=*")
    limits = {item.scope: item for item in await list_limits(site.store)}
    assert limits[Scope("project", project_id)].rpm == 30
    # No markup in a name ever ran.
    assert dialogs == []
