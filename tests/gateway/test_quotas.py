"""Budgets and rate windows counted from the store and the journal: what a team's or organisation's
projects spent and sent, deleted ones included."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from llmgw.gateway.allowance import Allowance
from llmgw.gateway.errors import ApiError
from llmgw.gateway.journal import Entry
from llmgw.gateway.quotas import Quotas, Short
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.keys import KeyRecord, create_key, revoke_key
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scopes import Scope, create_org, create_project, create_team, delete
from llmgw.store.usage import UsageKey, UsageTotals, add_usage


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    where: Path | str = tmp_path / "llmgw.db"
    if request.param == "postgresql":
        where = request.getfixturevalue("postgres_url")
    async with open_store(where) as store:
        yield store


async def _spend_then_delete(store: Store) -> tuple[Scope, Scope, KeyRecord, KeyRecord]:
    """Team `core` of org `acme`; its project `spender` spends 0.9 today, has its key revoked and is
    deleted. Returns the team, the org, a key of the team's other project, `rest`, and spender's key."""
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
    return Scope("team", team.id), Scope("org", org.id), rest_key, spender_key


class TestADeletedProjectsSpending:
    @pytest.mark.parametrize("level", ["team", "org"])
    async def test_still_counts_toward_its_teams_and_orgs_budget_which_refuses_at_its_limit(
        self, store: Store, level: str
    ) -> None:
        """Deleting a project that spent used to hand its team and org the money back: a way round them."""
        team, org, rest_key, _ = await _spend_then_delete(store)
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
            team, _, rest_key, _ = await _spend_then_delete(store)
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


def _sent_just_now(key: KeyRecord, n: int) -> list[Entry]:
    """What the usage journal holds of n requests of key's, 20 tokens each, admitted 10 s ago."""
    t = time.time() - 10
    day = datetime.now(UTC).date().isoformat()
    return [Entry(seq, t, day, key.id, key.project_id, "m", 200, 10, 10, 0.0, 1.0, True) for seq in range(n)]


class TestADeletedProjectsRequests:
    @pytest.mark.parametrize("level", ["team", "org"])
    @pytest.mark.parametrize(
        ("rpm", "tpm", "said"), [(3, None, "3 requests per minute"), (None, 70, "70 tokens per minute")]
    )
    async def test_still_fill_its_teams_and_orgs_rate_windows_rebuilt_after_a_restart(
        self, store: Store, level: str, rpm: int | None, tpm: int | None, said: str
    ) -> None:
        """A restart rebuilt the windows from the journal without them: send, delete, restart, send again."""
        team, org, rest_key, spender_key = await _spend_then_delete(store)
        await set_limits(store, team if level == "team" else org, rpm=rpm, tpm=tpm)
        quotas = Quotas(UsageRecorder())
        await quotas.refresh(store)
        quotas.restore(_sent_just_now(spender_key, 3))
        with pytest.raises(ApiError) as refused:
            quotas.admit(rest_key, 20, 0.0)
        assert refused.value.status == 429 and said in refused.value.message
