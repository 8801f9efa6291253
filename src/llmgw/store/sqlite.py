"""The store in one SQLite file: one aiosqlite connection, WAL, the schema brought up to date."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path

import aiosqlite

from llmgw.errors import StoreError
from llmgw.store.base import Args, Duplicate, IntegrityError, MissingReference, Queries, Row, Store
from llmgw.store.dialect import SQLITE
from llmgw.store.migrations import MIGRATIONS, Migration, NewerSchema, migrate


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except sqlite3.IntegrityError as exc:
        detail = str(exc)
        if "FOREIGN KEY" in detail:
            raise MissingReference(detail) from None
        if "UNIQUE" in detail:
            raise Duplicate(detail) from None
        raise IntegrityError(detail) from None


class SqliteStore(Store):
    """The store in the SQLite file at path."""

    dialect = SQLITE

    def __init__(self, path: Path, db: aiosqlite.Connection) -> None:
        self.path = path
        # The connection itself, for what only SQLite has (its pragmas, in its tests).
        self.db = db
        # One connection is shared by every task; without the lock two tasks'
        # statements would interleave inside one another's transaction.
        self._write_lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return str(self.path)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Queries]:
        async with self._write_lock:
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self
            except BaseException:
                await self.db.execute("ROLLBACK")
                raise
            await self.db.execute("COMMIT")

    async def fetch_all(self, sql: str, args: Args = ()) -> list[Row]:
        async with self.db.execute(sql, args) as cursor:
            return list(await cursor.fetchall())

    async def fetch_one(self, sql: str, args: Args = ()) -> Row | None:
        async with self.db.execute(sql, args) as cursor:
            row: Row | None = await cursor.fetchone()
            return row

    async def execute(self, sql: str, args: Args = ()) -> int:
        with _translated():
            async with self.db.execute(sql, args) as cursor:
                return cursor.rowcount

    async def execute_many(self, sql: str, rows: Iterable[Args]) -> None:
        with _translated():
            await self.db.executemany(sql, rows)

    async def insert(self, sql: str, args: Args = ()) -> int:
        with _translated():
            async with self.db.execute(sql, args) as cursor:
                new_id = cursor.lastrowid
        assert new_id is not None
        return new_id

    async def schema(self, statement: str) -> None:
        await self.db.execute(statement)


# How long a store being created by another process at the same moment is waited for.
_WAL_WAIT_S = 5.0


async def _use_wal(db: aiosqlite.Connection) -> sqlite3.Row | None:
    """Turn the store to write-ahead logging; the journal mode it is in after, as SQLite says it.

    SQLite refuses the change at once, without its busy wait, while another connection is turning
    a new store to WAL or migrating it (several servers or commands started together): wait for
    that one rather than refuse to start.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + _WAL_WAIT_S
    while True:
        try:
            async with db.execute("PRAGMA journal_mode = WAL") as cursor:
                return await cursor.fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or loop.time() > until:
                raise
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def open_sqlite(
    path: Path, migrations: Sequence[Migration] = MIGRATIONS, *, server: bool = False
) -> AsyncIterator[SqliteStore]:
    """Open (creating if need be) the SQLite store at path, in WAL mode, migrated to the latest schema.

    server: open it as the server does, for as long as it runs: alone (another server on the same
    file is refused) and checked whole first, so that a damaged store stops the start with one
    sentence rather than failing requests later. Any sqlite error that ends the caller's block is
    raised as a StoreError saying what to do.
    """
    try:
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory of the store {path}: {exc.strerror}") from None
    async with contextlib.AsyncExitStack() as held:
        if server:
            await _hold_alone(held, path)
        try:
            # isolation_level=None: the store issues BEGIN/COMMIT itself, so a
            # migration or a write is exactly one transaction.
            db = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise unusable(path, exc) from None
        try:
            db.row_factory = aiosqlite.Row
            # Another process (`llmgw keys create` while the server runs) may hold
            # the write lock for a moment; wait rather than fail. Set first: turning
            # a new store to WAL takes that lock too, and another server starting at
            # the same moment may be migrating it.
            await db.execute("PRAGMA busy_timeout = 5000")
            row = await _use_wal(db)
            if row is None or str(row[0]).lower() != "wal":
                raise StoreError(
                    f"the store {path} cannot use write-ahead logging (journal mode is {row and row[0]}); "
                    "is it on a network file system?"
                )
            # Safe with WAL: a power cut may lose the last commits, never corrupt.
            await db.execute("PRAGMA synchronous = NORMAL")
            store = SqliteStore(path, db)
            # Foreign keys on only after the migrations, as SQLite's recipe for rebuilding a table
            # says (store/ids.py): dropping the old copy with them on would cascade to the rows that
            # name it. SQLite takes the pragma only outside a transaction.
            await migrate(store, migrations)
            await db.execute("PRAGMA foreign_keys = ON")
            if server:
                await _check_whole(db, path)
        except NewerSchema as exc:
            await db.close()
            raise StoreError(
                f"the store {path} is at schema version {exc.found}, newer than this llmgw knows "
                f"({exc.known}): it was written by a later release; run that release (or later), or "
                "restore a backup made before the upgrade"
            ) from None
        except sqlite3.Error as exc:
            await db.close()
            raise unusable(path, exc) from None
        except BaseException:
            await db.close()
            raise
        try:
            yield store
        except sqlite3.DatabaseError as exc:
            # What ends the block is the store failing under it (a damaged page the check at open did
            # not read): the person gets the sentence, not the driver's traceback.
            raise unusable(path, exc) from None
        finally:
            await db.close()


def unusable(path: Path, exc: sqlite3.Error) -> StoreError:
    """One sentence naming the store and what to do, for an sqlite error that keeps it from being used."""
    name = getattr(exc, "sqlite_errorname", "")
    detail = str(exc)
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or "malformed" in detail:
        return StoreError(
            f"the store {path} is damaged ({detail}): stop every llmgw using it and restore it from a "
            f"backup (docs/operations.md), or save what can still be read with "
            f"`sqlite3 {path} .recover | sqlite3 {path}.recovered` and point `database` at that file"
        )
    if name.startswith("SQLITE_READONLY") or name in ("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH"):
        return StoreError(
            f"the store {path} cannot be written ({detail}): llmgw needs to write it and to create "
            f"{path.name}-wal and {path.name}-shm beside it; give the user llmgw runs as write access "
            "to the file and its directory, or point `database` at a writable place"
        )
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED"):
        return StoreError(
            f"the store {path} is locked by another process ({detail}): another llmgw may be using it; "
            "stop it, or wait for it to finish and start again"
        )
    return StoreError(f"cannot open the store {path}: {detail}")


async def _hold_alone(held: contextlib.AsyncExitStack, path: Path) -> None:
    """Take the server's lock on the store's file for as long as held is open; StoreError if taken."""

    def take() -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            # flock, not fcntl: SQLite's own locks are fcntl ones and would not see this one, nor it
            # them, so `llmgw keys create` still opens the store while the server runs.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return fd

    try:
        fd = await asyncio.to_thread(take)
    except BlockingIOError:
        raise StoreError(
            f"the store {path} is in use by another llmgw server on this machine: stop that server, "
            "or give this one its own `database` (or `state_dir`) in server.yaml"
        ) from None
    except OSError as exc:
        raise StoreError(
            f"the store {path} cannot be opened ({exc.strerror}): give the user llmgw runs as write "
            "access to the file and its directory, or point `database` at a writable place"
        ) from None
    # Closed after the connection (the stack unwinds in reverse): closing any descriptor of the
    # file drops this process's fcntl locks on it, SQLite's among them.
    held.callback(os.close, fd)


async def _check_whole(db: aiosqlite.Connection, path: Path) -> None:
    """StoreError when a page of the store is damaged. quick_check reads every page, not the indexes'
    agreement with their tables: the seconds a full integrity_check takes on a large store are not
    worth it at every start."""
    async with db.execute("PRAGMA quick_check(1)") as cursor:
        row = await cursor.fetchone()
    if row is not None and str(row[0]) != "ok":
        raise sqlite3.DatabaseError(f"database disk image is malformed: {' '.join(str(row[0]).split())}")
