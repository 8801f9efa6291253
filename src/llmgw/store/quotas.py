"""Limits (requests and tokens per minute) and budgets (money per period) of every scope.

The store holds what an administrator set; the gateway loads it into memory
and reloads it every second, so that no request waits on the database.
"""

from __future__ import annotations

from typing import Literal, cast

import attrs

from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, problem
from llmgw.store.base import Row, Store
from llmgw.store.scopes import Scope, ScopeError, ScopeKind

Period = Literal["day", "week", "month", "total"]
PERIODS: tuple[Period, ...] = ("day", "week", "month", "total")


@attrs.frozen
class Limits:
    """None: this scope sets no limit of that kind (a scope above it may)."""

    scope: Scope
    rpm: int | None
    tpm: int | None


@attrs.frozen
class Budget:
    scope: Scope
    amount: float
    period: Period


def _scope(row: Row) -> Scope:
    return Scope(cast(ScopeKind, row["scope_kind"]), int(row["scope_id"]))


async def set_limits(store: Store, scope: Scope, rpm: int | None, tpm: int | None) -> None:
    """Set the scope's limits; both None removes them."""
    for name, value in (("rpm", rpm), ("tpm", tpm)):
        # Past 64 bits SQLite refuses the integer with an OverflowError; far below, every front end stops.
        said = None if value is None else problem(f"{name} of {scope}", value, MAX_PER_MINUTE, whole=True)
        if said is not None:
            raise ScopeError(f"{said} (None for no limit)")
    async with store.transaction() as db:
        if rpm is None and tpm is None:
            await db.execute(
                "DELETE FROM limits WHERE scope_kind = ? AND scope_id = ?", (scope.kind, scope.id)
            )
            return
        await db.execute(
            "INSERT INTO limits (scope_kind, scope_id, rpm, tpm) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (scope_kind, scope_id) DO UPDATE SET rpm = excluded.rpm, tpm = excluded.tpm",
            (scope.kind, scope.id, rpm, tpm),
        )


async def list_limits(store: Store) -> list[Limits]:
    rows = await store.fetch_all("SELECT * FROM limits ORDER BY scope_kind, scope_id")
    return [Limits(_scope(row), row["rpm"], row["tpm"]) for row in rows]


async def set_budget(store: Store, scope: Scope, amount: float, period: str) -> None:
    """Set the scope's budget: amount (in the unit of the prices) per period."""
    if period not in PERIODS:
        raise ScopeError(f"a budget's period is one of {', '.join(PERIODS)}, not '{period}'")
    said = problem(f"the budget of {scope}", amount, MAX_BUDGET, whole=False)
    if said is not None:
        raise ScopeError(said)
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO budgets (scope_kind, scope_id, amount, period) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (scope_kind, scope_id)"
            " DO UPDATE SET amount = excluded.amount, period = excluded.period",
            (scope.kind, scope.id, amount, period),
        )


async def clear_budget(store: Store, scope: Scope) -> None:
    async with store.transaction() as db:
        await db.execute("DELETE FROM budgets WHERE scope_kind = ? AND scope_id = ?", (scope.kind, scope.id))


async def list_budgets(store: Store) -> list[Budget]:
    rows = await store.fetch_all("SELECT * FROM budgets ORDER BY scope_kind, scope_id")
    return [Budget(_scope(row), float(row["amount"]), cast(Period, row["period"])) for row in rows]
