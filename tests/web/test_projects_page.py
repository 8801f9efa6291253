"""The projects page over HTTP: who may use it, what a refused change says, and that changes stick."""

from __future__ import annotations

import aiohttp

from llmgw.store.scopes import load_hierarchy

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
