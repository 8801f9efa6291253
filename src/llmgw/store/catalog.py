"""Models added while the server runs (`llmgw ctl model add`), kept across restarts.

Stored as the text of their definition, YAML or JSON as it was sent, with the
name of the file it came from: read back at start through the same parser,
so a definition a later release can no longer read is refused with the same
file, line and key an operator would have seen adding it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import attrs

from llmgw.store.base import Store


@attrs.frozen
class StoredModel:
    name: str
    # The definition's text as it was added.
    definition: str
    # Where it came from ("model.yaml"), for errors that name it.
    source: str
    added_at: datetime


async def list_models(store: Store) -> list[StoredModel]:
    """Every stored model, by name."""
    rows = await store.fetch_all(
        "SELECT name, definition, source, added_at FROM catalog_models ORDER BY name"
    )
    return [
        StoredModel(
            name=row["name"],
            definition=row["definition"],
            source=row["source"],
            added_at=datetime.fromisoformat(row["added_at"]),
        )
        for row in rows
    ]


async def put_model(store: Store, name: str, definition: str, source: str) -> None:
    """Add the model, or replace the stored definition of the same name."""
    added_at = datetime.now(UTC).replace(microsecond=0).isoformat()
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO catalog_models (name, definition, source, added_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, "
            "source = excluded.source, added_at = excluded.added_at",
            (name, definition, source, added_at),
        )


async def delete_model(store: Store, name: str) -> bool:
    """Remove the stored model; False when none had that name."""
    async with store.transaction() as db:
        return await db.execute("DELETE FROM catalog_models WHERE name = ?", (name,)) > 0
