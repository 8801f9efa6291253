"""The store's schema, as numbered migrations applied in order at open.

Migration N is MIGRATIONS[N - 1]. A migration is never edited once released:
a store that already applied it would never see the change. Add a new one.
Each migration is a sequence of single statements rather than one script,
because sqlite3's executescript commits whatever transaction is open, and a
half-applied migration must roll back with the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import aiosqlite

from llmgw.errors import StoreError

Migration = Sequence[str]

MIGRATIONS: Sequence[Migration] = (
    # 1: API keys. Only the sha256 of a key is kept, with its first characters
    # so a person can tell keys apart in `llmgw keys list` and revoke one.
    (
        """
        CREATE TABLE api_keys (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            prefix TEXT NOT NULL UNIQUE,
            key_hash TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        )
        """,
    ),
)


async def schema_version(db: aiosqlite.Connection) -> int:
    """The highest migration applied; 0 for a new store."""
    async with db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ) as cursor:
        if await cursor.fetchone() is None:
            return 0
    async with db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version") as cursor:
        row = await cursor.fetchone()
    return int(row[0]) if row is not None else 0


async def migrate(db: aiosqlite.Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply the migrations the store lacks in one transaction; returns the schema version.

    db must be in autocommit mode (isolation_level=None) so that this function
    owns the transaction. BEGIN IMMEDIATE takes the write lock before reading
    the version, so two processes opening a new store at once cannot both
    apply migration 1.
    """
    await db.execute("BEGIN IMMEDIATE")
    try:
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        current = await schema_version(db)
        if current > len(migrations):
            raise StoreError(
                f"the store is at schema version {current}, newer than this llmgw knows "
                f"({len(migrations)}): it was written by a later release; upgrade llmgw"
            )
        for version, statements in enumerate(migrations, start=1):
            if version <= current:
                continue
            for statement in statements:
                await db.execute(statement)
            await db.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, datetime.now(UTC).isoformat(timespec="seconds")),
            )
    except BaseException:
        await db.execute("ROLLBACK")
        raise
    await db.execute("COMMIT")
    return len(migrations)
