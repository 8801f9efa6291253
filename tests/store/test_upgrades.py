"""The last roll of the agents, kept in the store so that a new leader carries it on."""

from __future__ import annotations

from llmgw.store import Store
from llmgw.store.upgrades import keep_roll, last_roll


async def test_a_store_no_roll_was_kept_in_has_none(store: Store) -> None:
    assert await last_roll(store) is None


async def test_the_roll_kept_last_replaces_the_one_before(store: Store) -> None:
    await keep_roll(store, '{"state":"running"}')
    await keep_roll(store, '{"state":"done"}')
    assert await last_roll(store) == '{"state":"done"}'
