"""The migrations a store lacks, read without changing it: `llmgw store migrate --check`.

Opening the store the usual way (db.py) applies them, and on SQLite creates the file and turns it to
write-ahead logging: this reads the schema version alone, over a read-only SQLite connection or one
PostgreSQL connection, so that it is safe against the store the running servers use.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import aiosqlite
import asyncpg
import attrs

from llmgw.config.database import PostgresUrl, is_postgres_url
from llmgw.errors import StoreError
from llmgw.store.base import Queries
from llmgw.store.migrations import MIGRATIONS, Migration, contracting_after, schema_version
from llmgw.store.postgres import CONNECT_TIMEOUT_S, PostgresStore
from llmgw.store.sqlite import SqliteStore, unusable


@attrs.frozen
class Pending:
    """Where the store's schema is, and the numbered migrations it lacks."""

    where: str
    # 0 for a store with no table yet (or no file): the first server creates every table.
    version: int
    known: int
    migrations: Sequence[tuple[int, Migration]]
    # Of the migrations a later release applied (version above known), those not recorded as only
    # expanding the schema: this release refuses the store while there is one.
    contracting_after: Sequence[int] = ()

    @property
    def newer(self) -> bool:
        """The store was migrated by a later release than this one."""
        return self.version > self.known


async def _read(where: str, queries: Queries, migrations: Sequence[Migration]) -> Pending:
    version = await schema_version(queries)
    if version > len(migrations):
        contracting = await contracting_after(queries, len(migrations), version)
        return Pending(where, version, len(migrations), [], contracting)
    return Pending(where, version, len(migrations), list(enumerate(migrations, start=1))[version:])


async def pending_migrations(database: Path | str, migrations: Sequence[Migration] = MIGRATIONS) -> Pending:
    """What the store database names lacks of migrations, read without writing anything to it."""
    if isinstance(database, str) and is_postgres_url(database):
        return await _postgres(database, migrations)
    return await _sqlite(Path(database), migrations)


async def _sqlite(path: Path, migrations: Sequence[Migration]) -> Pending:
    if not await asyncio.to_thread(path.exists):
        return Pending(str(path), 0, len(migrations), list(enumerate(migrations, start=1)))
    try:
        db = await aiosqlite.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise unusable(path, exc) from None
    try:
        await db.execute("PRAGMA busy_timeout = 5000")
        return await _read(str(path), SqliteStore(path, db), migrations)
    except sqlite3.Error as exc:
        raise unusable(path, exc) from None
    finally:
        await db.close()


async def _postgres(url: str, migrations: Sequence[Migration]) -> Pending:
    try:
        where = PostgresUrl.parse(url)
    except ValueError as exc:
        raise StoreError(f"`database` ({url}) is not a PostgreSQL address: {exc}") from None
    # One connection, made when the first statement needs it: the store's own pool translates a
    # refused connection into the sentence the server says.
    pool = await asyncpg.create_pool(url, min_size=0, max_size=1, timeout=CONNECT_TIMEOUT_S)
    try:
        return await _read(str(where), PostgresStore(where, pool), migrations)
    finally:
        with contextlib.suppress(Exception):
            await pool.close()
