"""Usage per day, key, project, model and status: what was asked, what it cost, how long it took.

The gateway adds up requests in memory and one writer task adds its totals
here in batches (gateway/usage.py); nothing here runs on a request's path.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from datetime import date
from typing import Literal

import attrs

from llmgw.store.base import Store
from llmgw.store.scopes import Scope


def _cost(value: float) -> float:
    """A cost as the store sums it; the largest float for inf, which JSON cannot carry.

    Earlier releases took a price of 1e308, and a long prompt then cost inf: such a row
    reads as more than any budget, so it still spends one, and usage replies stay JSON.
    """
    cost = float(value)
    return cost if math.isfinite(cost) else sys.float_info.max


@attrs.frozen
class UsageKey:
    """What usage is added up by."""

    day: str  # ISO date, UTC
    key_id: int  # 0: no key (auth disabled)
    project_id: int
    model: str
    status: int


@attrs.define
class UsageTotals:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0  # summed; divided by requests when read


@attrs.frozen
class UsageDay:
    """One day of one project's use of one model, every key and status together."""

    day: date
    project_id: int
    model: str
    requests: int
    errors: int  # requests answered with a status of 400 or more
    prompt_tokens: int
    completion_tokens: int
    cost: float
    latency_ms_avg: float

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen
class JournalMark:
    """The highest record of one server's usage journal (gateway/journal.py) that the store has."""

    journal_id: str
    seq: int


async def add_usage(
    store: Store, batch: Iterable[tuple[UsageKey, UsageTotals]], mark: JournalMark | None = None
) -> None:
    """Add a batch of totals to the day's rows, in one transaction; with mark, the highest record of the
    writing server's usage journal the batch covers, in the same one."""
    rows = [
        (
            k.day,
            k.key_id,
            k.project_id,
            k.model,
            k.status,
            t.requests,
            t.prompt_tokens,
            t.completion_tokens,
            t.cost,
            t.latency_ms,
        )
        for k, t in batch
    ]
    if not rows:
        return
    async with store.transaction() as db:
        if mark is not None:
            # A row per journal: one server's progress never stands for another's, whose records are
            # numbered by a counter of its own.
            await db.execute(
                "INSERT INTO usage_journal_marks (journal_id, applied_seq) VALUES (?, ?)"
                " ON CONFLICT (journal_id) DO UPDATE SET applied_seq = excluded.applied_seq"
                " WHERE usage_journal_marks.applied_seq < excluded.applied_seq",
                (mark.journal_id, mark.seq),
            )
        await db.execute_many(
            "INSERT INTO usage_daily (day, key_id, project_id, model, status, requests, prompt_tokens,"
            " completion_tokens, cost, latency_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (day, key_id, project_id, model, status) DO UPDATE SET"
            # Named with the table: PostgreSQL reads a bare `requests` as either row's.
            " requests = usage_daily.requests + excluded.requests,"
            " prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens,"
            " completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens,"
            " cost = usage_daily.cost + excluded.cost,"
            " latency_ms = usage_daily.latency_ms + excluded.latency_ms",
            rows,
        )


async def journal_applied(store: Store, journal_id: str) -> int | None:
    """The highest record of the journal journal_id that the usage table has; None when the store has
    never heard of that journal (its first start on this store, or a crash before its first write)."""
    applied = await store.fetch_value(
        "SELECT applied_seq FROM usage_journal_marks WHERE journal_id = ?", (journal_id,)
    )
    return int(applied) if applied is not None else None


async def shared_journal_mark(store: Store) -> int:
    """The one mark releases before migration 9 kept for every server: the highest record any server
    had written. What a journal made by such a release starts from (migration 9 says why)."""
    applied = await store.fetch_value("SELECT applied_seq FROM usage_journal WHERE id = 1")
    return int(applied) if applied is not None else 0


# A deleted project's usage stays under its id, and counts toward the team and org it was in
# (deleted_projects, migration 12); only one deleted before that release is in neither (NULL).
_TEAM = "COALESCE(p.team_id, d.team_id)"
_ORG = "COALESCE(t.org_id, d.org_id)"
_JOINS = (
    " FROM usage_daily u LEFT JOIN projects p ON p.id = u.project_id"
    " LEFT JOIN teams t ON t.id = p.team_id"
    " LEFT JOIN deleted_projects d ON d.project_id = u.project_id"
)

_SCOPE_FILTER = {
    "key": "u.key_id = ?",
    "project": "u.project_id = ?",
    "team": f"{_TEAM} = ?",
    "org": f"{_ORG} = ?",
}


async def usage_by_day(
    store: Store, scope: Scope | None = None, since: date | None = None, until: date | None = None
) -> list[UsageDay]:
    """Usage per day, project and model, oldest first; scope, since and until (inclusive) narrow it."""
    where: list[str] = []
    args: list[object] = []
    if scope is not None:
        where.append(_SCOPE_FILTER[scope.kind])
        args.append(scope.id)
    if since is not None:
        where.append("u.day >= ?")
        args.append(since.isoformat())
    if until is not None:
        where.append("u.day <= ?")
        args.append(until.isoformat())
    sql = (
        "SELECT u.day, u.project_id, u.model, SUM(u.requests) AS requests,"
        " SUM(CASE WHEN u.status >= 400 THEN u.requests ELSE 0 END) AS errors,"
        " SUM(u.prompt_tokens) AS prompt_tokens, SUM(u.completion_tokens) AS completion_tokens,"
        " SUM(u.cost) AS cost, SUM(u.latency_ms) AS latency_ms"
        + _JOINS
        + (" WHERE " + " AND ".join(where) if where else "")
        + " GROUP BY u.day, u.project_id, u.model ORDER BY u.day, u.project_id, u.model"
    )
    # int(): PostgreSQL sums 64-bit integers as numeric, which asyncpg reads as Decimal.
    return [
        UsageDay(
            day=date.fromisoformat(row["day"]),
            project_id=row["project_id"],
            model=row["model"],
            requests=int(row["requests"]),
            errors=int(row["errors"]),
            prompt_tokens=int(row["prompt_tokens"]),
            completion_tokens=int(row["completion_tokens"]),
            cost=_cost(row["cost"]),
            latency_ms_avg=float(row["latency_ms"]) / int(row["requests"]) if row["requests"] else 0.0,
        )
        for row in await store.fetch_all(sql, args)
    ]


async def cost_by_day(store: Store, since: str) -> list[tuple[str, int, int, float]]:
    """(day, key_id, project_id, cost) from since (ISO date) on: what budgets are counted from at start."""
    rows = await store.fetch_all(
        "SELECT day, key_id, project_id, SUM(cost) AS cost FROM usage_daily WHERE day >= ?"
        " GROUP BY day, key_id, project_id",
        (since,),
    )
    return [(row["day"], row["key_id"], row["project_id"], _cost(row["cost"])) for row in rows]


UsageBy = Literal["org", "team", "project", "key", "model"]
USAGE_BY: tuple[UsageBy, ...] = ("org", "team", "project", "key", "model")
_GROUP = {
    "org": _ORG,
    "team": _TEAM,
    "project": "u.project_id",
    "key": "u.key_id",
    "model": "u.model",
}


@attrs.frozen
class UsageTotal:
    """Everything one org, team, project, key or model used between two days."""

    # The id of the org, team, project or key, or the model; None: by team or org, usage of a project
    # deleted by a release that did not record which team it was in.
    group: int | str | None
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cost: float


async def usage_totals(
    store: Store, by: UsageBy, since: date | None = None, until: date | None = None
) -> list[UsageTotal]:
    """Usage added up by org, team, project, key or model, from since to until (inclusive).

    Every row of the range counts once, so the totals add up to the store's own sums: a deleted
    project's usage counts toward the team and org it was in, and one whose team nothing recorded
    (deleted by an earlier release) is its own group (None) rather than left out.
    """
    where: list[str] = []
    args: list[object] = []
    if since is not None:
        where.append("u.day >= ?")
        args.append(since.isoformat())
    if until is not None:
        where.append("u.day <= ?")
        args.append(until.isoformat())
    group = _GROUP[by]
    sql = (
        f"SELECT {group} AS grp, SUM(u.requests) AS requests,"
        " SUM(CASE WHEN u.status >= 400 THEN u.requests ELSE 0 END) AS errors,"
        " SUM(u.prompt_tokens) AS prompt_tokens, SUM(u.completion_tokens) AS completion_tokens,"
        " SUM(u.cost) AS cost"
        + _JOINS
        + (" WHERE " + " AND ".join(where) if where else "")
        + f" GROUP BY {group} ORDER BY {group}"
    )
    return [
        UsageTotal(
            group=row["grp"],
            requests=int(row["requests"]),
            errors=int(row["errors"]),
            prompt_tokens=int(row["prompt_tokens"]),
            completion_tokens=int(row["completion_tokens"]),
            cost=_cost(row["cost"]),
        )
        for row in await store.fetch_all(sql, args)
    ]
