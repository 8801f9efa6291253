"""The admin API's organisations, teams, projects, members, quotas and prices; their OpenAPI document."""

from __future__ import annotations

import io
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.adminapi import auth
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi import tenancy as tenancyapi
from llmgw.bodies import MAX_ADMIN_BODY
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.gateway.admission import TEMPLATE_OVERHEAD
from llmgw.gateway.app import MAX_BODY as MAX_GATEWAY_BODY
from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, MAX_PRICE_PER_1K, MAX_TOKENS
from llmgw.pricing import cost
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key
from llmgw.store.usage import UsageKey, UsageTotals, add_usage
from llmgw.store.users import create_user
from llmgw.web.admin_listener import document

SIM = ModelConfig(name="sim-chat", profiles=[ProfileConfig(engine="sim")])
CFG = ServerConfig(
    models=[SIM],
    pricing={"sim-chat": PriceConfig(prompt_per_1k=0.1, completion_per_1k=0.2)},
    admin_tokens=[auth.hash_token("s3cret")],
)
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


@pytest.fixture
async def client(store: Store) -> AsyncIterator[Client]:
    app = web.Application()
    adminapi.install(app, CFG, Inventory(5.0), Catalog(CFG))
    # A gateway that has counted 1.25 spent of every budget.
    tenancyapi.install(app, store, lambda scope: 1.25)
    async with TestClient(TestServer(app)) as client:
        yield client


async def _json(client: Client, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with client.request(method, url, json=body) as reply:
        return reply.status, await reply.json()


@pytest.fixture
async def acme(client: Client) -> None:
    assert (await _json(client, "POST", "/api/v1/orgs", {"name": "acme"}))[0] == 201
    assert (await _json(client, "POST", "/api/v1/teams", {"name": "core", "parent": "acme"}))[0] == 201
    assert (await _json(client, "POST", "/api/v1/projects", {"name": "web", "parent": "core"}))[0] == 201


class TestHierarchy:
    async def test_a_project_created_by_name_names_its_team_and_org(self, client: Client, acme: None) -> None:
        status, projects = await _json(client, "GET", "/api/v1/projects?team=core")
        assert status == 200
        assert projects == [
            {"id": 2, "name": "web", "team_id": 2, "team": "core", "org_id": 2, "org": "acme", "models": None}
        ]

    async def test_a_name_its_parent_has_is_a_409_and_an_unknown_parent_a_404(
        self, client: Client, acme: None
    ) -> None:
        status, body = await _json(client, "POST", "/api/v1/projects", {"name": "web", "parent": "core"})
        assert status == 409 and "already has a project called 'web'" in body["error"]
        status, body = await _json(client, "POST", "/api/v1/projects", {"name": "x", "parent": "nope"})
        assert status == 404 and "there is no team 'nope'" in body["error"]

    async def test_rename_and_delete_take_a_name_or_an_id(self, client: Client, acme: None) -> None:
        status, team = await _json(client, "PATCH", "/api/v1/teams/core", {"name": "platform"})
        assert status == 200 and team["name"] == "platform"
        status, body = await _json(client, "DELETE", "/api/v1/teams/2")
        assert status == 409 and "still has projects web" in body["error"]
        assert (await _json(client, "DELETE", "/api/v1/projects/web"))[0] == 200
        status, body = await _json(client, "DELETE", "/api/v1/teams/platform")
        assert status == 200 and body == {"name": "team 'platform' (org 'acme')", "deleted": True}

    async def test_a_body_that_is_not_what_the_route_takes_is_a_400_with_an_example(
        self, client: Client
    ) -> None:
        async with client.post(
            "/api/v1/orgs", data="nope", headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400 and "the body is not JSON; send" in (await r.json())["error"]
        status, body = await _json(client, "POST", "/api/v1/teams", {"name": "core"})
        assert status == 400 and "parent must be a non-empty string" in body["error"]


class TestMembers:
    async def test_an_account_added_by_email_is_listed_and_removed_by_id(
        self, client: Client, acme: None, store: Store
    ) -> None:
        user = await create_user(store, "ana@example.com", "a long password")
        status, member = await _json(
            client, "POST", "/api/v1/projects/web/members", {"user": "ana@example.com"}
        )
        assert status == 200 and member["status"] == "active" and member["project_id"] == 2
        assert [m["email"] for m in (await _json(client, "GET", "/api/v1/projects/web/members"))[1]] == [
            "ana@example.com"
        ]
        status, body = await _json(client, "DELETE", "/api/v1/projects/web")
        assert status == 409 and "members ana@example.com" in body["error"]
        status, member = await _json(client, "DELETE", f"/api/v1/projects/web/members/{user.id}")
        assert status == 200 and member["project_id"] is None


class TestQuotas:
    async def test_a_field_left_out_stays_and_a_null_one_is_cleared(self, client: Client, acme: None) -> None:
        url = "/api/v1/quotas/project:web"
        status, quota = await _json(
            client, "PUT", url, {"rpm": 60, "tpm": 1000, "budget": 5, "period": "day"}
        )
        assert status == 200
        assert quota == {
            "scope": "project:2",
            "name": "project 'web' (team 'core', org 'acme')",
            "rpm": 60,
            "tpm": 1000,
            "budget": 5.0,
            "period": "day",
            "spent": 1.25,
            "unpriced": None,
        }
        status, quota = await _json(client, "PUT", url, {"tpm": None})
        assert (quota["rpm"], quota["tpm"], quota["budget"]) == (60, None, 5.0)
        assert [q["scope"] for q in (await _json(client, "GET", "/api/v1/quotas"))[1]] == ["project:2"]
        status, quota = await _json(client, "DELETE", url)
        assert status == 200 and (quota["rpm"], quota["budget"]) == (None, None)

    def test_the_document_lets_a_change_leave_out_any_field_as_the_route_does(self) -> None:
        """It required all four (rpm, tpm, budget, period), while a field left out keeps its value."""
        doc = document("test")
        body = doc["paths"]["/api/v1/quotas/{scope}"]["put"]["requestBody"]["content"]["application/json"]
        schema = {**body["schema"], "components": doc["components"]}
        for change in ({"tpm": None}, {"rpm": 5}, {"budget": 1, "period": "day"}, {}):
            jsonschema.validate(change, schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"rpm": 5, "colour": "red"}, schema)

    async def test_setting_a_budget_while_a_model_has_no_price_says_so_until_it_has_one(
        self, store: Store
    ) -> None:
        free = ModelConfig(name="free-chat", profiles=[ProfileConfig(engine="sim")])
        cfg = attrs.evolve(CFG, models=[SIM, free])
        app = web.Application()
        adminapi.install(app, cfg, Inventory(5.0), Catalog(cfg))
        tenancyapi.install(app, store, None)
        async with TestClient(TestServer(app)) as client:
            url = "/api/v1/quotas/project:default"
            status, quota = await _json(client, "PUT", url, {"budget": 5, "period": "month"})
            assert status == 200
            assert quota["unpriced"].startswith("no price applies to free-chat, so budgets never bind")
            # A limit alone is not a budget: nothing to say.
            assert (await _json(client, "PUT", url, {"rpm": 5}))[1]["unpriced"] is None
            price = {"prompt_per_1k": 0.1, "completion_per_1k": 0.1}
            assert (await _json(client, "PUT", "/api/v1/prices/free-chat", price))[0] == 200
            status, quota = await _json(client, "PUT", url, {"budget": 6})
            assert status == 200 and quota["unpriced"] is None

    async def test_a_key_is_named_by_its_prefix(self, client: Client, store: Store) -> None:
        _, key = await create_key(store, "ci")
        status, quota = await _json(client, "PUT", f"/api/v1/quotas/key:{key.prefix}", {"rpm": 1})
        assert status == 200 and quota["scope"] == f"key:{key.id}" and quota["name"].startswith("key 'ci'")

    async def test_a_limit_that_is_not_a_whole_number_of_0_or_more_is_a_400(self, client: Client) -> None:
        for bad in ({"rpm": 1.5}, {"rpm": -1}, {"rpm": True}, {"budget": "ten"}):
            status, body = await _json(client, "PUT", "/api/v1/quotas/project:default", bad)
            assert status == 400, bad
            assert body["error"]


class TestBounds:
    async def _raw(self, client: Client, method: str, url: str, body: str) -> tuple[int, Any]:
        """body as sent, for numbers Python's JSON writer would not write (1e400) or writes as non-JSON."""
        async with client.request(
            method, url, data=body, headers={"Content-Type": "application/json"}
        ) as reply:
            return reply.status, json.loads(await reply.text(), parse_constant=_not_json)

    async def test_a_rate_past_its_bound_is_a_400_naming_the_bound_and_changes_nothing(
        self, client: Client
    ) -> None:
        """{"rpm": 1e20} reached SQLite, which holds 64-bit integers: a 500 with an OverflowError."""
        url = "/api/v1/quotas/org:default"
        for field in ("rpm", "tpm"):
            for bad in (1e20, 2.5e24, 10**20, MAX_PER_MINUTE + 1, -1):
                status, body = await _json(client, "PUT", url, {field: bad})
                assert status == 400, (field, bad)
                assert f"{field} is " in body["error"]
                assert "a whole number from 0 to 1,000,000,000,000" in body["error"]
            status, body = await _json(client, "PUT", url, {field: True})
            assert status == 400 and f"{field} must be a whole number" in body["error"]
        assert (await _json(client, "GET", "/api/v1/quotas"))[1] == []
        status, quota = await _json(client, "PUT", url, {"rpm": MAX_PER_MINUTE, "tpm": 1e12})
        assert status == 200 and (quota["rpm"], quota["tpm"]) == (MAX_PER_MINUTE, MAX_PER_MINUTE)

    async def test_a_budget_that_is_not_a_finite_amount_within_its_bound_is_a_400(
        self, client: Client
    ) -> None:
        url = "/api/v1/quotas/org:default"
        for bad in ("1e13", "1e400", "-1e400", "NaN", "Infinity", "-0.5", "true"):
            status, body = await self._raw(client, "PUT", url, f'{{"budget": {bad}, "period": "day"}}')
            assert status == 400 and body["error"], bad
        status, body = await _json(client, "PUT", url, {"budget": 1e13, "period": "day"})
        assert "budget is 10000000000000; it must be a number from 0 to 1,000,000,000,000" in body["error"]
        assert (await _json(client, "GET", "/api/v1/quotas"))[1] == []
        status, quota = await _json(client, "PUT", url, {"budget": MAX_BUDGET, "period": "day"})
        assert status == 200 and quota["budget"] == MAX_BUDGET

    async def test_a_price_past_its_bound_is_a_400_and_the_model_keeps_its_price(
        self, client: Client
    ) -> None:
        """1e308 was taken, and one long prompt then cost inf."""
        url = "/api/v1/prices/sim-chat"
        for bad in ("1e308", "1000001", "1e400", "NaN", "-Infinity", "-1", "false"):
            status, body = await self._raw(
                client, "PUT", url, f'{{"prompt_per_1k": {bad}, "completion_per_1k": 1}}'
            )
            assert status == 400 and body["error"], bad
        status, body = await _json(client, "PUT", url, {"prompt_per_1k": 1, "completion_per_1k": 1e308})
        assert status == 400
        assert "completion_per_1k is 1e+308; it must be a number from 0 to 1,000,000" in body["error"]
        (price,) = (await _json(client, "GET", "/api/v1/prices"))[1]
        assert price["source"] == "pricing"

    async def test_usage_charged_at_the_dearest_prices_is_json_with_finite_costs(
        self, client: Client, store: Store
    ) -> None:
        """A request charged at the bound for the most tokens any request is charged for stays finite."""
        price = {"prompt_per_1k": MAX_PRICE_PER_1K, "completion_per_1k": MAX_PRICE_PER_1K}
        assert (await _json(client, "PUT", "/api/v1/prices/sim-chat", price))[0] == 200
        prompt, completion = MAX_GATEWAY_BODY + TEMPLATE_OVERHEAD, MAX_TOKENS
        each = cost(PriceConfig(**price), prompt, completion)
        rows = [
            (
                UsageKey(f"2026-11-{day:02}", 1, 1, "sim-chat", 200),
                UsageTotals(1, prompt, completion, each, 1.0),
            )
            for day in range(1, 29)
        ]
        await add_usage(store, rows)
        for by in ("project", "model", "org"):
            status, text = await self._text(client, f"/api/v1/usage?by={by}")
            assert status == 200
            (row,) = json.loads(text, parse_constant=_not_json)
            assert math.isfinite(row["cost"]) and row["cost"] == pytest.approx(28 * each)

    async def _text(self, client: Client, url: str) -> tuple[int, str]:
        async with client.get(url) as reply:
            return reply.status, await reply.text()

    async def test_the_document_says_each_bound(self) -> None:
        schemas = document("test")["components"]["schemas"]
        quota, price = schemas["QuotaChange"]["properties"], schemas["PriceChange"]["properties"]
        assert quota["rpm"]["maximum"] == quota["tpm"]["maximum"] == MAX_PER_MINUTE
        assert quota["budget"]["maximum"] == MAX_BUDGET
        assert price["prompt_per_1k"]["maximum"] == price["completion_per_1k"]["maximum"] == MAX_PRICE_PER_1K


class TestIds:
    """Ids are ASCII digits: int() reads Arabic-Indic (٢) and full-width (２) digits as 2."""

    @pytest.mark.parametrize("digit", ["\u0662", "\uff12", "\u06f2"])
    async def test_another_scripts_digit_names_no_scope_even_where_its_id_exists(
        self, client: Client, acme: None, digit: str
    ) -> None:
        for method, url, body in (
            ("DELETE", f"/api/v1/orgs/{digit}", None),
            ("PATCH", f"/api/v1/teams/{digit}", {"name": "renamed"}),
            ("PUT", f"/api/v1/quotas/project:{digit}", {"rpm": 5}),
            ("PUT", f"/api/v1/projects/{digit}/models", {"models": None}),
            ("GET", f"/api/v1/projects/{digit}/members", None),
        ):
            status, reply = await _json(client, method, url, body)
            assert status == 404 and f"'{digit}'" in reply["error"], (url, reply)
        assert [o["name"] for o in (await _json(client, "GET", "/api/v1/orgs"))[1]] == ["default", "acme"]
        assert [t["name"] for t in (await _json(client, "GET", "/api/v1/teams"))[1]] == ["default", "core"]
        assert (await _json(client, "GET", "/api/v1/quotas"))[1] == []

    @pytest.mark.parametrize("digit", ["\u0662", "\uff12"])
    async def test_another_scripts_digit_is_no_accounts_id(
        self, client: Client, acme: None, store: Store, digit: str
    ) -> None:
        await create_user(store, "root@example.com", "a long password")
        user = await create_user(store, "ana@example.com", "a long password")
        assert user.id == 2
        status, reply = await _json(client, "POST", "/api/v1/projects/web/members", {"user": digit})
        assert status == 404 and f"'{digit}'" in reply["error"]
        assert (await _json(client, "POST", "/api/v1/projects/web/members", {"user": 2}))[0] == 200
        status, reply = await _json(client, "DELETE", f"/api/v1/projects/web/members/{digit}")
        assert status == 404, reply
        members = (await _json(client, "GET", "/api/v1/projects/web/members"))[1]
        assert [m["id"] for m in members] == [2]


def _not_json(constant: str) -> float:
    raise AssertionError(f"the reply holds {constant}, which is not JSON")


class TestUsage:
    async def test_usage_by_project_adds_up_every_key_and_model_of_the_range(
        self, client: Client, store: Store
    ) -> None:
        rows = [
            (UsageKey("2026-11-01", 1, 1, "a", 200), UsageTotals(2, 10, 5, 0.5, 1.0)),
            (UsageKey("2026-11-02", 2, 1, "b", 500), UsageTotals(1, 3, 0, 0.0, 1.0)),
            (UsageKey("2026-11-03", 1, 1, "a", 200), UsageTotals(4, 40, 40, 1.0, 1.0)),
        ]
        await add_usage(store, rows)
        status, body = await _json(client, "GET", "/api/v1/usage?since=2026-11-01&until=2026-11-02")
        assert status == 200
        assert body == [
            {
                "by": "project",
                "id": "1",
                "name": "project 'default' (team 'default', org 'default')",
                "requests": 3,
                "errors": 1,
                "prompt_tokens": 13,
                "completion_tokens": 5,
                "total_tokens": 18,
                "cost": 0.5,
            }
        ]
        status, body = await _json(client, "GET", "/api/v1/usage?by=week")
        assert status == 400 and "by is 'week'; it is one of org, team, project, key, model" in body["error"]


class TestPrices:
    async def test_a_price_set_comes_before_server_yaml_and_clearing_it_brings_that_back(
        self, client: Client
    ) -> None:
        status, prices = await _json(client, "GET", "/api/v1/prices")
        assert prices == [
            {"model": "sim-chat", "prompt_per_1k": 0.1, "completion_per_1k": 0.2, "source": "pricing"}
        ]
        url = "/api/v1/prices/meta-llama/Llama-3.1-8B"
        status, price = await _json(client, "PUT", url, {"prompt_per_1k": 1, "completion_per_1k": 2.5})
        assert status == 200 and price == {
            "model": "meta-llama/Llama-3.1-8B",
            "prompt_per_1k": 1.0,
            "completion_per_1k": 2.5,
            "source": "set",
        }
        status, price = await _json(client, "DELETE", url)
        assert status == 200 and price["source"] == "none"


async def test_on_the_client_port_every_route_needs_an_admin_token(store: Store) -> None:
    app = web.Application()
    guard = auth.admin_token_or_session(CFG, _no_session)
    adminapi.install(app, CFG, Inventory(5.0), Catalog(CFG), prefix="/admin", guard=guard)
    tenancyapi.install(app, store, None, prefix="/admin", guard=guard)
    async with TestClient(TestServer(app)) as client:
        for route in tenancyapi.ROUTES:
            path = "/admin" + route.path.format(item="default", user="1", scope="org:default", model="m")
            async with client.request(route.method, path, json={}) as reply:
                assert reply.status == 401, path
        async with client.get("/admin/api/v1/orgs", headers={"Authorization": "Bearer s3cret"}) as reply:
            assert reply.status == 200


JSON = {"Content-Type": "application/json"}


async def _no_session(request: web.Request) -> bool:
    return False


async def test_every_status_of_every_route_is_asked_and_its_reply_validates(
    client: Client, store: Store
) -> None:
    doc = document("test")
    replies: list[tuple[str, str, int, Any]] = []

    async def ask(method: str, route: str, url: str, body: Any = None) -> None:
        status, reply = await _json(client, method, url, body)
        replies.append((method.lower(), route, status, reply))

    user = await create_user(store, "ana@example.com", "a long password")
    for collection, parent in (("orgs", "default"), ("teams", "default"), ("projects", "default")):
        base = f"/api/v1/{collection}"
        item = base + "/{item}"
        await ask("POST", base, base, {"name": "x", "parent": parent})
        await ask("POST", base, base, {"name": "x", "parent": parent})
        await ask("POST", base, base, {"name": ""})
        await ask("GET", base, base)
        if collection != "orgs":
            await ask("POST", base, base, {"name": "y", "parent": "nope"})
            await ask("GET", base, base + "?org=nope&team=nope")
        await ask("PATCH", item, f"{base}/x", {"name": "z"})
        await ask("PATCH", item, f"{base}/z", {"name": "default"})
        await ask("PATCH", item, f"{base}/z", {})
        await ask("PATCH", item, f"{base}/nope", {"name": "q"})
        await ask("DELETE", item, f"{base}/default")
        await ask("DELETE", item, f"{base}/nope")
        await ask("DELETE", item, f"{base}/z")
    members = "/api/v1/projects/{item}/members"
    await ask("GET", members, "/api/v1/projects/default/members")
    await ask("GET", members, "/api/v1/projects/nope/members")
    await ask("POST", members, "/api/v1/projects/default/members", {"user": user.id})
    await ask("POST", members, "/api/v1/projects/default/members", {"user": ""})
    await ask("POST", members, "/api/v1/projects/default/members", {"user": "nobody@example.com"})
    member = members + "/{user}"
    await ask("DELETE", member, "/api/v1/projects/default/members/ana@example.com")
    await ask("DELETE", member, "/api/v1/projects/default/members/ana@example.com")
    await ask("DELETE", member, "/api/v1/projects/default/members/nobody@example.com")
    models = "/api/v1/projects/{item}/models"
    await ask("PUT", models, "/api/v1/projects/default/models", {"models": ["sim-chat"]})
    await ask("PUT", models, "/api/v1/projects/default/models", {"models": "sim-chat"})
    await ask("PUT", models, "/api/v1/projects/nope/models", {"models": None})
    quota = "/api/v1/quotas/{scope}"
    await ask("PUT", quota, "/api/v1/quotas/project:default", {"rpm": 5, "budget": 1, "period": "month"})
    await ask("PUT", quota, "/api/v1/quotas/project:default", {"rpm": -5})
    await ask("PUT", quota, "/api/v1/quotas/project:nope", {"rpm": 5})
    await ask("GET", "/api/v1/quotas", "/api/v1/quotas")
    await ask("DELETE", quota, "/api/v1/quotas/project:default")
    await ask("DELETE", quota, "/api/v1/quotas/nonsense")
    await ask("DELETE", quota, "/api/v1/quotas/team:nope")
    price = "/api/v1/prices/{model}"
    await ask("PUT", price, "/api/v1/prices/sim-chat", {"prompt_per_1k": 1, "completion_per_1k": 2})
    await ask("PUT", price, "/api/v1/prices/sim-chat", {"prompt_per_1k": 1})
    await ask("GET", "/api/v1/prices", "/api/v1/prices")
    await ask("DELETE", price, "/api/v1/prices/sim-chat")
    await ask("DELETE", price, "/api/v1/prices/sim-chat")

    await ask("GET", "/api/v1/usage", "/api/v1/usage?by=model&since=2026-01-01&until=2026-12-31")
    await ask("GET", "/api/v1/usage", "/api/v1/usage?by=colour")
    await ask("GET", "/api/v1/usage", "/api/v1/usage?since=yesterday")
    # Two teams called "dup" (in two orgs), a project called "dup" in each: finding one by that
    # name is a 409 that says the ids, wherever a route finds a team or a project by name.
    for org in ("o1", "o2"):
        await _json(client, "POST", "/api/v1/orgs", {"name": org})
        _, team = await _json(client, "POST", "/api/v1/teams", {"name": "dup", "parent": org})
        await _json(client, "POST", "/api/v1/projects", {"name": "dup", "parent": str(team["id"])})
    await ask("GET", "/api/v1/projects", "/api/v1/projects?team=dup")
    await ask("PUT", models, "/api/v1/projects/dup/models", {"models": None})
    await ask("GET", members, "/api/v1/projects/dup/members")
    await ask("POST", members, "/api/v1/projects/dup/members", {"user": user.id})
    await ask("DELETE", member, "/api/v1/projects/dup/members/ana@example.com")
    await ask("PUT", quota, "/api/v1/quotas/team:dup", {"rpm": 5})
    await ask("DELETE", quota, "/api/v1/quotas/project:dup")
    # Every route that takes a body refuses one that is not JSON, one past the admin API's limit, and
    # a field it does not take.
    for route in tenancyapi.ROUTES:
        if route.body is None:
            continue
        url = route.path.format(item="default", model="sim-chat", scope="project:default")
        async with client.request(route.method, url, data=b"name=x") as answer:
            replies.append((route.method.lower(), route.path, answer.status, await answer.json()))
        big = io.BytesIO(json.dumps({"name": "x" * MAX_ADMIN_BODY}).encode())
        async with client.request(route.method, url, data=big, headers=JSON) as answer:
            replies.append((route.method.lower(), route.path, answer.status, await answer.json()))
        await ask(route.method, route.path, url, {"nmae": "typo"})

    ours = {route.path for route in tenancyapi.ROUTES}
    documented = {
        (method, route, int(status))
        for route, item in doc["paths"].items()
        if route in ours
        for method, operation in item.items()
        for status in operation["responses"]
    }
    assert {(method, route, status) for method, route, status, _ in replies} == documented
    for method, route, status, body in replies:
        content = doc["paths"][route][method]["responses"][str(status)]["content"]["application/json"]
        try:
            jsonschema.validate(body, {**content["schema"], "components": doc["components"]})
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{method.upper()} {route} {status} is not what the document says: {exc.message}")
