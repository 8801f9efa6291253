"""Budgets counted from the store: what a team's or organisation's projects spent, deleted ones included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from llmgw.gateway.allowance import Allowance
from llmgw.gateway.errors import ApiError
from llmgw.gateway.quotas import Quotas, Short
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.keys import KeyRecord, create_key, revoke_key
from llmgw.store.quotas import set_budget
from llmgw.store.scopes import Scope, create_org, create_project, create_team, delete
from llmgw.store.usage import UsageKey, UsageTotals, add_usage


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    where: Path | str = tmp_path / "llmgw.db"
    if request.param == "postgresql":
        where = request.getfixturevalue("postgres_url")
    async with open_store(where) as store:
        yield store


async def _spend_then_delete(store: Store) -> tuple[Scope, Scope, KeyRecord]:
    """Team `core` of org `acme`; its project `spender` spends 0.9 today, has its key revoked and is
    deleted. Returns the team, the org and a key of the team's other project, `rest`."""
    org = await create_org(store, "acme")
    team = await create_team(store, org.id, "core")
    spender = await create_project(store, team.id, "spender")
    rest = await create_project(store, team.id, "rest")
    _, spender_key = await create_key(store, "spender-key", project_id=spender.id)
    _, rest_key = await create_key(store, "rest-key", project_id=rest.id)
    today = datetime.now(UTC).date().isoformat()
    await add_usage(
        store, [(UsageKey(today, spender_key.id, spender.id, "m", 200), UsageTotals(3, 10, 10, 0.9, 1.0))]
    )
    await revoke_key(store, spender_key.prefix)
    await delete(store, Scope("project", spender.id))
    return Scope("team", team.id), Scope("org", org.id), rest_key


class TestADeletedProjectsSpending:
    @pytest.mark.parametrize("level", ["team", "org"])
    async def test_still_counts_toward_its_teams_and_orgs_budget_which_refuses_at_its_limit(
        self, store: Store, level: str
    ) -> None:
        """Deleting a project that spent used to hand its team and org the money back: a way round them."""
        team, org, rest_key = await _spend_then_delete(store)
        budget = team if level == "team" else org
        await set_budget(store, budget, 1.0, "total")
        quotas = Quotas(UsageRecorder())
        await quotas.refresh(store)
        assert quotas.spent(budget) == pytest.approx(0.9)
        quotas.admit(rest_key, 10, 0.05)
        with pytest.raises(ApiError) as refused:
            quotas.admit(rest_key, 10, 0.2)
        assert refused.value.status == 429 and "0.9 of 1 spent" in refused.value.message

    async def test_still_counts_for_a_gateway_sharing_the_budget_through_leases(
        self, postgres_url: str
    ) -> None:
        """Several gateways on one PostgreSQL: one started after the delete claims no lease past it."""
        async with open_store(postgres_url) as store:
            team, _, rest_key = await _spend_then_delete(store)
            await set_budget(store, team, 1.0, "total")
            pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=2)
            try:
                quotas = Quotas(UsageRecorder(), allowance=Allowance(pool))
                await quotas.refresh(store)
                try:
                    quotas.admit(rest_key, 10, 0.2)
                except Short as short:
                    await quotas.admit_leased(rest_key, 10, 0.2, short)
            except ApiError as refused:
                assert refused.status == 429 and "the budget of team 'core'" in refused.message
            else:
                pytest.fail("a request past the team's budget was admitted")
            finally:
                pool.terminate()
