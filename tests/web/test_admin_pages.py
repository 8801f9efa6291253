"""The quotas and usage pages: limits and budgets edited per scope; tokens per day per project in SVG."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import aiohttp
from structlog.testing import capture_logs

from llmgw.store.quotas import list_budgets, list_limits
from llmgw.store.scopes import Scope, create_project
from llmgw.store.usage import UsageKey, UsageTotals, add_usage

from .conftest import Site, login


class TestQuotasPage:
    async def test_an_admin_sets_and_clears_a_projects_limits_and_budget(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        project = await create_project(site.store, 1, "research")
        scope = Scope("project", project.id)
        response = await client.post(
            "/admin/quotas",
            data={
                "scope": str(scope),
                "rpm": "60",
                "tpm": "",
                "budget": "12.5",
                "period": "week",
                "csrf": csrf,
            },
        )
        text = await response.text()
        assert response.status == 200 and "Saved the quotas of project" in text
        limits = {item.scope: item for item in await list_limits(site.store)}
        assert limits[scope].rpm == 60 and limits[scope].tpm is None
        (budget,) = await list_budgets(site.store)
        assert budget.scope == scope and budget.amount == 12.5 and budget.period == "week"
        # The page shows what was saved, in the row's inputs.
        row = text.split(f'id="q-project-{project.id}-row"')[1].split("</tr>")[0]
        assert 'name="rpm" value="60"' in row and 'name="budget" value="12.5"' in row
        await client.post(
            "/admin/quotas", data={"scope": str(scope), "rpm": "", "tpm": "", "budget": "", "csrf": csrf}
        )
        assert await list_limits(site.store) == [] and await list_budgets(site.store) == []

    async def test_a_budget_no_price_applies_to_is_reported_on_the_page(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        response = await client.post(
            "/admin/quotas", data={"scope": "org:1", "budget": "5", "period": "month", "csrf": csrf}
        )
        assert "budgets are set but no price applies to sim-chat: they never bind" in await response.text()

    async def test_a_model_added_with_ctl_that_no_price_applies_to_is_reported_too(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.catalog.add("name: sim-added\nprofiles:\n  - engine: sim\n", "added.yaml")
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        response = await client.post(
            "/admin/quotas", data={"scope": "org:1", "budget": "5", "period": "month", "csrf": csrf}
        )
        assert "budgets are set but no price applies to sim-added: they never bind" in await response.text()

    async def test_saving_a_budget_while_models_have_no_price_says_so_with_the_save_and_in_the_log(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.catalog.add("name: sim-added\nprofiles:\n  - engine: sim\n", "added.yaml")
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        with capture_logs() as logs:
            response = await client.post(
                "/admin/quotas", data={"scope": "org:1", "budget": "5", "period": "month", "csrf": csrf}
            )
        text = html.unescape(await response.text())
        flash = text.split('role="status">')[1].split("</p>")[0]
        assert flash.startswith("Saved the quotas of ")
        assert flash.endswith(
            "This budget does not bind everything: no price applies to sim-chat and sim-added, so budgets "
            "never bind on what they serve; give each `pricing` (in server.yaml or the model's definition) "
            "or set `default_price`."
        )
        (logged,) = [e for e in logs if e["event"].startswith("a budget was set but no price applies")]
        assert (logged["scope"], logged["models"]) == ("org:1", ["sim-chat", "sim-added"])
        # Limits alone bind whatever the prices: saving them says nothing of prices.
        response = await client.post(
            "/admin/quotas", data={"scope": "org:1", "rpm": "10", "budget": "", "csrf": csrf}
        )
        assert "This budget does not bind" not in await response.text()

    async def test_a_value_that_is_not_a_number_is_refused_in_a_sentence(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        response = await client.post("/admin/quotas", data={"scope": "org:1", "rpm": "lots", "csrf": csrf})
        assert response.status == 400
        assert (
            "Rpm is &#39;lots&#39;; write a whole number from 0 to 1,000,000,000,000, or leave it empty "
            "for none." in await response.text()
        )
        assert await list_limits(site.store) == []

    async def test_a_number_past_its_bound_is_refused_naming_it_and_nothing_is_saved(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        """rpm 100000000000000000000 reached SQLite (a 500), and a budget of inf or nan was saved."""
        await site.user("root@example.com", admin=True)
        csrf = await login(client, "root@example.com")
        for form, said in (
            (
                {"rpm": "100000000000000000000"},
                "Rpm is 1e+20; it must be a whole number from 0 to 1,000,000,000,000",
            ),
            ({"tpm": "\u0661\u0660"}, "Tpm is &#39;\u0661\u0660&#39;; write a whole number"),
            (
                {"rpm": "5", "budget": "inf"},
                "Budget is &#39;inf&#39;; write a number from 0 to 1,000,000,000,000",
            ),
            ({"rpm": "5", "budget": "nan"}, "Budget is &#39;nan&#39;; write a number"),
            ({"rpm": "5", "budget": "1e13"}, "Budget is 10000000000000; it must be a number from 0 to"),
        ):
            response = await client.post(
                "/admin/quotas", data={"scope": "org:1", "period": "day", "csrf": csrf, **form}
            )
            assert response.status == 400 and said in await response.text(), form
        assert await list_limits(site.store) == [] and await list_budgets(site.store) == []
        page = await (await client.get("/admin/quotas")).text()
        assert 'max="1000000000000" step="1" name="rpm"' in page


class TestUsagePage:
    async def test_the_chart_has_a_bar_segment_per_day_and_project_with_its_tokens(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        research = await create_project(site.store, 1, "research <&>")
        today = datetime.now(UTC).date()
        yesterday = today - timedelta(days=1)
        await add_usage(
            site.store,
            [
                (UsageKey(today.isoformat(), 1, 1, "sim-chat", 200), UsageTotals(2, 100, 50, 0.0, 20.0)),
                (
                    UsageKey(today.isoformat(), 2, research.id, "sim-chat", 200),
                    UsageTotals(1, 30, 10, 0.0, 5.0),
                ),
                (UsageKey(yesterday.isoformat(), 1, 1, "sim-chat", 200), UsageTotals(1, 7, 3, 0.0, 5.0)),
            ],
        )
        text = await (await client.get("/admin/usage")).text()
        svg = text.split('<svg class="chart"')[1].split("</svg>")[0]
        titles = [html.unescape(t) for t in re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', svg)]
        assert f"{today} · project 'default' (team 'default', org 'default'): 150 tokens" in titles
        assert f"{today} · project 'research <&>' (team 'default', org 'default'): 40 tokens" in titles
        assert f"{yesterday} · project 'default' (team 'default', org 'default'): 10 tokens" in titles
        assert len(titles) == 3

    async def test_with_no_usage_the_page_says_so_and_draws_an_empty_chart(
        self, site: Site, client: aiohttp.ClientSession
    ) -> None:
        await site.user("root@example.com", admin=True)
        await login(client, "root@example.com")
        text = await (await client.get("/admin/usage?days=7")).text()
        assert "No requests in these days." in text and '<svg class="chart"' in text
        assert '<rect class="bar"' not in text
