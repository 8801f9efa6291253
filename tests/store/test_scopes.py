"""Orgs -> teams -> projects: a default of each from the first start, names stored verbatim."""

from __future__ import annotations

import pytest

from llmgw.store import Store
from llmgw.store.keys import create_key, list_keys
from llmgw.store.quotas import list_budgets, list_limits, set_budget, set_limits
from llmgw.store.scopes import (
    DEFAULT_PROJECT_ID,
    Scope,
    ScopeError,
    create_org,
    create_project,
    create_team,
    load_hierarchy,
)

NASTY = "x'); DROP TABLE orgs; -- \" <b>&amp;</b> % _ \\ ; SELECT * FROM api_keys"


class TestHierarchy:
    async def test_a_fresh_store_has_a_default_org_team_and_project(self, store: Store) -> None:
        chain = (await load_hierarchy(store)).chain(DEFAULT_PROJECT_ID)
        assert (chain.org.name, chain.team.name, chain.project.name) == ("default", "default", "default")

    async def test_a_project_resolves_to_its_team_and_org(self, store: Store) -> None:
        org = await create_org(store, "acme")
        team = await create_team(store, org.id, "search")
        project = await create_project(store, team.id, "ranker")
        hierarchy = await load_hierarchy(store)
        chain = hierarchy.chain(project.id)
        assert chain.scopes == (Scope("project", project.id), Scope("team", team.id), Scope("org", org.id))
        assert hierarchy.name(Scope("project", project.id)) == "project 'ranker' (team 'search', org 'acme')"

    async def test_a_key_belongs_to_the_default_project_unless_told_otherwise(self, store: Store) -> None:
        team = await create_team(store, 1, "ml")
        project = await create_project(store, team.id, "eval")
        _, plain = await create_key(store, "plain")
        await create_key(store, "placed", project_id=project.id, models=["sim-chat"])
        assert plain.project_id == DEFAULT_PROJECT_ID and plain.models is None
        assert [(k.name, k.project_id, k.models) for k in await list_keys(store)] == [
            ("plain", DEFAULT_PROJECT_ID, None),
            ("placed", project.id, ("sim-chat",)),
        ]

    async def test_a_key_in_a_project_that_does_not_exist_is_refused(self, store: Store) -> None:
        with pytest.raises(ValueError, match="there is no project 42"):
            await create_key(store, "lost", project_id=42)

    async def test_names_full_of_sql_metacharacters_are_stored_verbatim(self, store: Store) -> None:
        org = await create_org(store, NASTY)
        team = await create_team(store, org.id, NASTY)
        project = await create_project(store, team.id, NASTY)
        _, key = await create_key(store, NASTY, project_id=project.id, models=[NASTY])
        chain = (await load_hierarchy(store)).chain(project.id)
        assert chain.org.name == chain.team.name == chain.project.name == NASTY
        assert (await list_keys(store))[-1].name == NASTY and key.models == (NASTY,)

    async def test_a_duplicate_name_within_a_parent_is_refused_saying_so(self, store: Store) -> None:
        await create_team(store, 1, "ml")
        with pytest.raises(ScopeError, match="already has a team called 'ml'"):
            await create_team(store, 1, "ml")
        with pytest.raises(ScopeError, match="no organisation 9"):
            await create_team(store, 9, "ml")

    def test_a_scope_reads_and_writes_as_kind_colon_id(self) -> None:
        assert Scope.parse("team:3") == Scope("team", 3) and str(Scope("team", 3)) == "team:3"
        with pytest.raises(ScopeError, match="is not a scope"):
            Scope.parse("galaxy:1")


class TestQuotas:
    async def test_limits_and_budgets_are_set_replaced_and_removed(self, store: Store) -> None:
        await set_limits(store, Scope("project", 1), rpm=60, tpm=None)
        await set_limits(store, Scope("project", 1), rpm=30, tpm=1000)
        await set_limits(store, Scope("key", 5), rpm=1, tpm=None)
        await set_limits(store, Scope("key", 5), rpm=None, tpm=None)
        assert [(str(x.scope), x.rpm, x.tpm) for x in await list_limits(store)] == [("project:1", 30, 1000)]
        await set_budget(store, Scope("org", 1), 10.0, "month")
        assert [(str(b.scope), b.amount, b.period) for b in await list_budgets(store)] == [
            ("org:1", 10.0, "month")
        ]
        with pytest.raises(ScopeError, match="one of day, week, month, total"):
            await set_budget(store, Scope("org", 1), 10.0, "fortnight")
