"""Opening the store: one aiosqlite connection, WAL, the schema brought up to date."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiosqlite
import attrs

from llmgw.errors import StoreError
from llmgw.store.migrations import MIGRATIONS, Migration, migrate


@attrs.define
class Store:
    """The open store. Modules per aggregate (store/keys.py, ...) take it as their first argument."""

    path: Path
    db: aiosqlite.Connection
    # One connection is shared by every task; without the lock two tasks'
    # statements would interleave inside one another's transaction.
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
        async with self._write_lock:
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                await self.db.execute("ROLLBACK")
                raise
            await self.db.execute("COMMIT")


@contextlib.asynccontextmanager
async def open_store(path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> AsyncIterator[Store]:
    """Open (creating if need be) the SQLite store at path, in WAL mode, migrated to the latest schema."""
    try:
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory of the store {path}: {exc.strerror}") from None
    try:
        # isolation_level=None: the store issues BEGIN/COMMIT itself, so a
        # migration or a write is exactly one transaction.
        db = await aiosqlite.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store {path}: {exc}") from None
    try:
        db.row_factory = aiosqlite.Row
        async with db.execute("PRAGMA journal_mode = WAL") as cursor:
            row = await cursor.fetchone()
        if row is None or str(row[0]).lower() != "wal":
            raise StoreError(
                f"the store {path} cannot use write-ahead logging (journal mode is {row and row[0]}); "
                "is it on a network file system?"
            )
        # Another process (`llmgw keys create` while the server runs) may hold
        # the write lock for a moment; wait rather than fail.
        await db.execute("PRAGMA busy_timeout = 5000")
        await db.execute("PRAGMA foreign_keys = ON")
        # Safe with WAL: a power cut may lose the last commits, never corrupt.
        await db.execute("PRAGMA synchronous = NORMAL")
        await migrate(db, migrations)
    except sqlite3.Error as exc:
        await db.close()
        raise StoreError(f"cannot open the store {path}: {exc}") from None
    except BaseException:
        await db.close()
        raise
    try:
        yield Store(path=path, db=db)
    finally:
        await db.close()
