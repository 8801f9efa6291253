"""The projects page and the usage CSV over HTTP: who may use them, what a refusal says, what they hold."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import aiohttp

from llmgw.store.keys import list_keys
from llmgw.store.scopes import load_hierarchy
from llmgw.store.usage import UsageKey, UsageTotals, add_usage
from llmgw.tenancy import operations as tenancy

from .conftest import Site, login


class TestProjectsPage:
    async def test_a_person_who_is_not_an_administrator_is_refused(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("ana@example.com")
        csrf = await login(client, "ana@example.com")
        assert (await client.get("/admin/projects")).status == 403
        reply = await client.post(
            "/admin/projects/create", data={"kind": "org", "name": "mine", "csrf": csrf}
        )
        assert reply.status == 403
        assert "mine" not in [o.name for o in (await load_hierarchy(site.store)).orgs.values()]

    async def test_a_change_without_the_sessions_csrf_token_is_refused(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        reply = await client.post("/admin/projects/create", data={"kind": "org", "name": "acme"})
        assert reply.status == 403
        assert len((await load_hierarchy(site.store)).orgs) == 1

    async def test_a_refused_change_says_why_in_a_sentence_and_changes_nothing(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        reply = await client.post(
            "/admin/projects/create", data={"kind": "project", "name": "default", "parent": "1", "csrf": csrf}
        )
        assert reply.status == 400
        assert (
            "Team &#39;default&#39; (org &#39;default&#39;) already has a project called"
            in await reply.text()
        )
        reply = await client.post("/admin/projects/delete", data={"kind": "team", "id": "1", "csrf": csrf})
        assert reply.status == 400 and "The default team is where keys and accounts go" in await reply.text()

    async def test_rename_and_delete_through_the_page_reach_the_store(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        await client.post("/admin/projects/create", data={"kind": "org", "name": "acme", "csrf": csrf})
        reply = await client.post(
            "/admin/projects/rename", data={"kind": "org", "id": "2", "name": "acme-corp", "csrf": csrf}
        )
        assert reply.status == 200 and "Renamed: it is org &#39;acme-corp&#39; now." in await reply.text()
        reply = await client.post("/admin/projects/delete", data={"kind": "org", "id": "2", "csrf": csrf})
        assert reply.status == 200 and "Deleted." in await reply.text()
        assert [o.name for o in (await load_hierarchy(site.store)).orgs.values()] == ["default"]


class TestUsageCsv:
    async def test_the_usage_page_offers_a_csv_of_its_range_that_adds_up_to_the_store(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        today = datetime.now(UTC).date()
        await add_usage(
            site.store,
            [
                (UsageKey(today.isoformat(), 1, 1, "sim-chat", 200), UsageTotals(3, 300, 120, 0.25, 30.0)),
                (UsageKey(today.isoformat(), 1, 1, "other", 400), UsageTotals(1, 40, 0, 0.0, 9.0)),
                (UsageKey("2000-01-01", 1, 1, "other", 200), UsageTotals(9, 9, 9, 9.0, 9.0)),
            ],
        )
        page = await (await client.get("/admin/usage?days=7")).text()
        assert 'action="/admin/usage.csv"' in page and "Download CSV" in page
        since = today - timedelta(days=6)
        reply = await client.get(f"/admin/usage.csv?by=model&since={since}&until={today}")
        assert reply.status == 200 and reply.content_type == "text/csv"
        assert reply.headers["Content-Disposition"] == (
            f'attachment; filename="llmgw-usage-by-model-{since}-to-{today}.csv"'
        )
        rows = list(csv.DictReader(io.StringIO(await reply.text())))
        assert [(r["name"], r["requests"], r["errors"], r["total_tokens"]) for r in rows] == [
            ("other", "1", "1", "40"),
            ("sim-chat", "3", "0", "420"),
        ]

    async def test_a_bad_grouping_is_a_page_that_says_so(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        reply = await client.get("/admin/usage.csv?by=colour")
        assert reply.status == 400 and "By is &#39;colour&#39;" in await reply.text()

    async def test_only_an_administrator_downloads_it(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("ana@example.com")
        await login(client, "ana@example.com")
        assert (await client.get("/admin/usage.csv")).status == 403


class TestMembersMakeKeys:
    async def test_a_person_added_to_a_project_creates_keys_for_it_on_their_profile(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await tenancy.create(site.store, "org", "acme")
        await tenancy.create(site.store, "team", "core", "acme")
        project = await tenancy.create(site.store, "project", "web", "core")
        await site.user("ana@example.com", status="pending")
        await tenancy.add_member(site.store, "web", "ana@example.com")
        csrf = await login(client, "ana@example.com")
        reply = await client.post("/profile/keys", data={"name": "laptop", "csrf": csrf})
        assert reply.status == 200 and "sk-llmgw-" in await reply.text()
        (key,) = [k for k in await list_keys(site.store) if k.name == "laptop"]
        assert key.project_id == project.id
        # Taken out of the project, they create no more.
        await tenancy.remove_member(site.store, "web", "ana@example.com")
        reply = await client.post("/profile/keys", data={"name": "phone", "csrf": csrf})
        assert reply.status == 403
