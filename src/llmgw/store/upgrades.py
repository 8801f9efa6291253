"""The last roll of the agents to another release (`llmgw ctl upgrade`), kept across a change of leader.

One row, the last roll's, replaced at each of its changes: a control plane that takes the lead carries
a roll under way on from where it stood, and `llmgw ctl upgrade status` reads it on any control plane.
Kept as the control plane's own JSON of the roll (control/upgrades.py), which the store does not read.
"""

from __future__ import annotations

from datetime import UTC, datetime

from llmgw.store.base import Store

# The one row's key: there is only ever the last roll.
_LAST = "last"


async def last_roll(store: Store) -> str | None:
    """The last roll's JSON, None when no roll was ever kept."""
    row = await store.fetch_one("SELECT roll FROM agent_upgrades WHERE which = ?", (_LAST,))
    return str(row["roll"]) if row is not None else None


async def keep_roll(store: Store, roll: str) -> None:
    """Keep roll as the last one, in place of any before it."""
    updated_at = datetime.now(UTC).isoformat(timespec="seconds")
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO agent_upgrades (which, roll, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (which) DO UPDATE SET roll = excluded.roll, updated_at = excluded.updated_at",
            (_LAST, roll, updated_at),
        )
