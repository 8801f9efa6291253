"""Usage is written in batches by one writer, queryable by scope and day, and survives a restart."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmgw.errors import StoreError
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.base import NotCommitted
from llmgw.store.scopes import Scope, create_org, create_project, create_team, delete, list_deleted_projects
from llmgw.store.usage import (
    JournalMark,
    UsageKey,
    UsageTotals,
    add_usage,
    journal_applied,
    usage_by_day,
    usage_totals,
)

from ..postgres import Cluster
from ..waiting import eventually_async


async def test_usage_recorded_before_a_restart_is_there_after_it(database: Path | str) -> None:
    async with open_store(database) as store:
        team = await create_team(store, 1, "ml")
        other = await create_project(store, team.id, "eval")
        recorder = UsageRecorder(interval_s=3600)
        writer = asyncio.create_task(recorder.run(store))
        recorder.record(7, 1, "sim-chat", 200, 10, 5, 0.25, 12.0)
        recorder.record(7, 1, "sim-chat", 200, 20, 5, 0.25, 8.0)
        recorder.record(7, 1, "sim-chat", 429, 0, 0, 0.0, 0.0)
        recorder.record(8, other.id, "sim-chat", 200, 1, 1, 0.0, 4.0)
        # Stopping flushes once more: this is what the server does on shutdown.
        recorder.stop()
        await writer
    async with open_store(database) as store:
        today = datetime.now(UTC).date()
        rows = await usage_by_day(store, Scope("project", 1))
        assert [
            (r.day, r.model, r.requests, r.errors, r.prompt_tokens, r.completion_tokens) for r in rows
        ] == [(today, "sim-chat", 3, 1, 30, 10)]
        assert rows[0].cost == 0.5 and rows[0].latency_ms_avg == 20.0 / 3
        assert [r.project_id for r in await usage_by_day(store, Scope("team", team.id))] == [other.id]
        assert len(await usage_by_day(store, Scope("org", 1))) == 2
        assert [r.requests for r in await usage_by_day(store, Scope("key", 8), since=today, until=today)] == [
            1
        ]


async def test_batches_add_up_rather_than_replace(store: Store) -> None:
    recorder = UsageRecorder()
    recorder.record(1, 1, "m", 200, 1, 2, 0.0, 1.0)
    await recorder.flush(store)
    recorder.record(1, 1, "m", 200, 1, 2, 0.0, 1.0)
    await recorder.flush(store)
    assert [(r.requests, r.prompt_tokens, r.completion_tokens) for r in await usage_by_day(store)] == [
        (2, 2, 4)
    ]


async def test_a_deleted_projects_usage_still_counts_toward_its_team_and_org(store: Store) -> None:
    """Deleting a project that spent used to take its usage off its team's and org's, budgets included."""
    org = await create_org(store, "acme")
    team = await create_team(store, org.id, "core")
    project = await create_project(store, team.id, "gone")
    used = UsageKey("2026-11-02", 0, project.id, "m", 200), UsageTotals(4, 1, 1, 0.5, 1.0)
    await add_usage(store, [used])
    await delete(store, Scope("project", project.id))
    (gone,) = await list_deleted_projects(store)
    assert gone.scopes == (Scope("project", project.id), Scope("team", team.id), Scope("org", org.id))
    for by, group in (("team", team.id), ("org", org.id), ("project", project.id)):
        assert [(t.group, t.requests, t.cost) for t in await usage_totals(store, by)] == [(group, 4, 0.5)]
    for scope in (Scope("team", team.id), Scope("org", org.id)):
        assert [r.requests for r in await usage_by_day(store, scope)] == [4]


class TestJournalMarks:
    async def test_each_journal_has_a_mark_of_its_own_that_never_goes_back(self, store: Store) -> None:
        row = [(UsageKey("2026-01-01", 1, 1, "m", 200), UsageTotals(1, 1, 1, 0.0, 1.0))]
        await add_usage(store, row, JournalMark("a", 100))
        await add_usage(store, row, JournalMark("b", 3))
        await add_usage(store, row, JournalMark("a", 50))
        assert await journal_applied(store, "a") == 100
        assert await journal_applied(store, "b") == 3
        assert await journal_applied(store, "c") is None


class TestAWriteToPostgresqlThatFails:
    async def test_a_store_that_refuses_the_connection_certainly_committed_nothing(
        self, postgres: Cluster, postgres_url: str
    ) -> None:
        async with open_store(postgres_url) as store:
            await asyncio.to_thread(postgres.stop)
            try:
                with pytest.raises(NotCommitted):
                    async with store.transaction() as db:
                        await db.execute("SELECT 1")
            finally:
                await asyncio.to_thread(postgres.start)

    async def test_a_connection_lost_at_commit_may_have_committed(self, postgres_url: str) -> None:
        async with open_store(postgres_url) as store:
            with pytest.raises(StoreError) as failed:
                async with store.transaction() as db:
                    pid = await db.fetch_value("SELECT pg_backend_pid()")
                    # Another connection ends this one's: what a PostgreSQL failing over does.
                    await store.fetch_value("SELECT pg_terminate_backend(?)", (pid,))

                    async def gone() -> bool:
                        active = "SELECT count(*) FROM pg_stat_activity WHERE pid = ?"
                        return int(await store.fetch_value(active, (pid,))) == 0

                    await eventually_async(gone)
            assert not isinstance(failed.value, NotCommitted)
