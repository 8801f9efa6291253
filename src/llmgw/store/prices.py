"""Prices set with `llmgw prices set` or the admin API: kept in the store, before server.yaml's.

The gateway reloads them every second with the limits and budgets, so a price
set on a running server binds within a second, and a restart keeps it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import attrs

from llmgw.config import PriceConfig
from llmgw.maxima import MAX_PRICE_PER_1K, problem
from llmgw.store.base import Store
from llmgw.store.scopes import ScopeError


@attrs.frozen
class StoredPrice:
    model: str
    price: PriceConfig
    set_at: datetime


def _checked(model: str, name: str, value: float) -> float:
    # NaN compares false with everything: stored, it would make every budget check pass. A price
    # past the bound (1e308 was taken) made a long prompt cost inf, which no JSON reply can hold.
    said = problem(f"the {name} price of {model}", value, MAX_PRICE_PER_1K, whole=False)
    if said is not None:
        raise ScopeError(said)
    return value


async def set_price(store: Store, model: str, prompt_per_1k: float, completion_per_1k: float) -> StoredPrice:
    """Set what model costs per 1,000 prompt and completion tokens, replacing any price set before."""
    if not model.strip():
        raise ScopeError("say which model the price is for")
    price = PriceConfig(
        prompt_per_1k=_checked(model, "prompt", prompt_per_1k),
        completion_per_1k=_checked(model, "completion", completion_per_1k),
    )
    set_at = datetime.now(UTC).replace(microsecond=0)
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO prices (model, prompt_per_1k, completion_per_1k, set_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (model) DO UPDATE SET prompt_per_1k = excluded.prompt_per_1k,"
            " completion_per_1k = excluded.completion_per_1k, set_at = excluded.set_at",
            (model, price.prompt_per_1k, price.completion_per_1k, set_at.isoformat()),
        )
    return StoredPrice(model, price, set_at)


async def clear_price(store: Store, model: str) -> bool:
    """Forget the price set for model (server.yaml's applies again); False if none was set."""
    async with store.transaction() as db:
        return bool(await db.execute("DELETE FROM prices WHERE model = ?", (model,)))


async def list_prices(store: Store) -> list[StoredPrice]:
    # Earlier releases took any finite price (1e308): one past the bound charges as the bound, so
    # that no request costs inf.
    return [
        StoredPrice(
            row["model"],
            PriceConfig(
                prompt_per_1k=min(row["prompt_per_1k"], MAX_PRICE_PER_1K),
                completion_per_1k=min(row["completion_per_1k"], MAX_PRICE_PER_1K),
            ),
            datetime.fromisoformat(row["set_at"]),
        )
        for row in await store.fetch_all("SELECT * FROM prices ORDER BY model")
    ]
