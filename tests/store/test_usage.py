"""Usage is written in batches by one writer, queryable by scope and day, and survives a restart."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.scopes import Scope, create_project, create_team
from llmgw.store.usage import usage_by_day


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
