"""The store refuses a rate, a budget or a price past its bound, on either database, whoever asks."""

from __future__ import annotations

import math
import sys

import pytest

from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, MAX_PRICE_PER_1K
from llmgw.store import Store
from llmgw.store.prices import list_prices, set_price
from llmgw.store.quotas import list_budgets, list_limits, set_budget, set_limits
from llmgw.store.scopes import Scope, ScopeError
from llmgw.store.usage import UsageKey, UsageTotals, add_usage, usage_totals

ORG = Scope("org", 1)


@pytest.mark.parametrize("rpm", [10**20, MAX_PER_MINUTE + 1, -1])
async def test_a_rate_past_its_bound_is_refused_in_words_not_an_overflow(store: Store, rpm: int) -> None:
    """10**20 reached SQLite's 64-bit integers: OverflowError, a 500 on the admin API."""
    with pytest.raises(
        ScopeError, match=r"rpm of org:1 is .*; it must be a whole number from 0 to 1,000,000,"
    ):
        await set_limits(store, ORG, rpm, None)
    assert await list_limits(store) == []
    await set_limits(store, ORG, MAX_PER_MINUTE, MAX_PER_MINUTE)
    (limits,) = await list_limits(store)
    assert (limits.rpm, limits.tpm) == (MAX_PER_MINUTE, MAX_PER_MINUTE)


@pytest.mark.parametrize("amount", [math.inf, math.nan, 1e13, -0.5])
async def test_a_budget_that_is_not_a_finite_amount_within_its_bound_is_refused(
    store: Store, amount: float
) -> None:
    with pytest.raises(ScopeError, match="the budget of org:1 is"):
        await set_budget(store, ORG, amount, "day")
    assert await list_budgets(store) == []
    await set_budget(store, ORG, MAX_BUDGET, "day")
    assert [b.amount for b in await list_budgets(store)] == [MAX_BUDGET]


@pytest.mark.parametrize("price", [1e308, MAX_PRICE_PER_1K * 1.5, math.inf, math.nan])
async def test_a_price_past_its_bound_is_refused(store: Store, price: float) -> None:
    """1e308 was taken, and a long prompt then cost inf."""
    with pytest.raises(ScopeError, match="it must be a number from 0 to 1,000,000"):
        await set_price(store, "sim-chat", 1.0, price)
    assert await list_prices(store) == []


async def test_a_price_an_earlier_release_stored_past_the_bound_charges_as_the_bound(store: Store) -> None:
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO prices (model, prompt_per_1k, completion_per_1k, set_at) VALUES (?, ?, ?, ?)",
            ("sim-chat", 1e308, 0.5, "2026-01-01T00:00:00+00:00"),
        )
    (stored,) = await list_prices(store)
    assert (stored.price.prompt_per_1k, stored.price.completion_per_1k) == (MAX_PRICE_PER_1K, 0.5)


async def test_a_cost_an_earlier_release_stored_as_inf_reads_as_the_largest_finite_number(
    store: Store,
) -> None:
    """Such a row still spends any budget, and a usage reply that holds it is still JSON."""
    await add_usage(
        store, [(UsageKey("2026-01-01", 0, 1, "sim-chat", 200), UsageTotals(1, 9, 0, math.inf, 1.0))]
    )
    (total,) = await usage_totals(store, "project")
    assert total.cost == sys.float_info.max
