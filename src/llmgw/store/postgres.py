"""The store in PostgreSQL, through a pool of asyncpg connections: for several control planes sharing one.

The same store modules and migrations as SQLite (dialect.py translates); what is SQLite's alone stays
in sqlite.py: the file lock against a second server (several servers sharing PostgreSQL is the point),
the check for damaged pages (PostgreSQL checks its own), and `llmgw store backup` (pg_dump does it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence

import asyncpg

from llmgw.config.database import PostgresUrl
from llmgw.errors import StoreError
from llmgw.store.base import (
    Args,
    Duplicate,
    IntegrityError,
    MissingReference,
    NotCommitted,
    Queries,
    Row,
    Store,
)
from llmgw.store.dialect import POSTGRESQL
from llmgw.store.migrations import MIGRATIONS, Migration, NewerSchema, migrate

# How long a server waits for PostgreSQL to answer a new connection: an address that drops packets
# would otherwise hold the start for asyncpg's default of a minute before saying anything.
CONNECT_TIMEOUT_S = 10.0
# Connections the server keeps: its writes are one usage batch a second and an administrator's changes,
# its reads the caches' refresh every second; a few spare keep a slow statement from queueing the rest.
POOL_SIZE = 8
CLOSE_TIMEOUT_S = 5.0


@contextlib.contextmanager
def _translated(where: PostgresUrl) -> Iterator[None]:
    try:
        yield
    except asyncpg.UniqueViolationError as exc:
        raise Duplicate(_one_line(exc)) from None
    except asyncpg.ForeignKeyViolationError as exc:
        raise MissingReference(_one_line(exc)) from None
    except asyncpg.IntegrityConstraintViolationError as exc:
        raise IntegrityError(_one_line(exc)) from None
    # InternalClientError: what asyncpg raises for a statement on a connection PostgreSQL has just ended
    # (measured at COMMIT after pg_terminate_backend), before it notices the connection is gone.
    except (
        OSError,
        TimeoutError,
        asyncpg.InterfaceError,
        asyncpg.InternalClientError,
        asyncpg.PostgresConnectionError,
    ) as exc:
        raise StoreError(f"the PostgreSQL store at {where} cannot be reached ({_reason(exc)})") from None
    except (asyncpg.AdminShutdownError, asyncpg.CannotConnectNowError) as exc:
        raise StoreError(f"the PostgreSQL store at {where} is shutting down or starting ({exc})") from None


def _one_line(exc: BaseException) -> str:
    """PostgreSQL's message and its DETAIL on one line: the person reads it in one sentence."""
    return " ".join(str(exc).split())


def _changed(status: str) -> int:
    """The rows a command changed, from its status ("UPDATE 3", "INSERT 0 1")."""
    last = status.rpartition(" ")[2]
    return int(last) if last.isdigit() else 0


class _Connection(Queries):
    """Statements on one connection of the pool: a transaction's."""

    dialect = POSTGRESQL

    def __init__(self, conn: asyncpg.Connection, where: PostgresUrl) -> None:
        self._conn = conn
        self._where = where

    async def fetch_all(self, sql: str, args: Args = ()) -> list[Row]:
        with _translated(self._where):
            return list(await self._conn.fetch(POSTGRESQL.query(sql), *args))

    async def fetch_one(self, sql: str, args: Args = ()) -> Row | None:
        with _translated(self._where):
            row: Row | None = await self._conn.fetchrow(POSTGRESQL.query(sql), *args)
            return row

    async def execute(self, sql: str, args: Args = ()) -> int:
        with _translated(self._where):
            return _changed(await self._conn.execute(POSTGRESQL.query(sql), *args))

    async def execute_many(self, sql: str, rows: Iterable[Args]) -> None:
        with _translated(self._where):
            await self._conn.executemany(POSTGRESQL.query(sql), rows)

    async def insert(self, sql: str, args: Args = ()) -> int:
        with _translated(self._where):
            return int(await self._conn.fetchval(POSTGRESQL.returning_id(sql), *args))

    async def schema(self, statement: str) -> None:
        with _translated(self._where):
            await self._conn.execute(POSTGRESQL.schema(statement))


class PostgresStore(Store):
    """The store in the PostgreSQL database url names."""

    dialect = POSTGRESQL

    def __init__(self, url: PostgresUrl, pool: asyncpg.Pool) -> None:
        self.url = url
        self._pool = pool

    @property
    def pool(self) -> asyncpg.Pool:
        """The connections, for what talks to PostgreSQL directly: the gateways' leases of allowance."""
        return self._pool

    @property
    def where(self) -> str:
        return str(self.url)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[_Connection]:
        # Only the driver's calls are translated, never the caller's block: an OSError of the caller's
        # own is not the store going away.
        with _translated(self.url):
            conn = await self._pool.acquire()
        try:
            yield _Connection(conn, self.url)
        finally:
            # A connection PostgreSQL dropped fails its reset here; the pool has closed it already,
            # and what the caller raised is the error to see.
            with contextlib.suppress(Exception):
                await self._pool.release(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Queries]:
        committing = False
        try:
            async with self._connection() as queries:
                transaction = queries._conn.transaction()
                with _translated(self.url):
                    await transaction.start()
                try:
                    yield queries
                except BaseException:
                    # On a connection that died, ROLLBACK fails too, and PostgreSQL has rolled it back.
                    with contextlib.suppress(Exception):
                        await transaction.rollback()
                    raise
                committing = True
                with _translated(self.url):
                    await transaction.commit()
        except StoreError as exc:
            # Said apart, because a writer that takes every failure for a possible commit must ask
            # the store what landed; one that failed before COMMIT was sent (the connection refused,
            # the store gone mid-statement) certainly landed nothing.
            if committing or isinstance(exc, NotCommitted):
                raise
            raise NotCommitted(str(exc)) from None

    async def fetch_all(self, sql: str, args: Args = ()) -> list[Row]:
        async with self._connection() as queries:
            return await queries.fetch_all(sql, args)

    async def fetch_one(self, sql: str, args: Args = ()) -> Row | None:
        async with self._connection() as queries:
            return await queries.fetch_one(sql, args)

    async def execute(self, sql: str, args: Args = ()) -> int:
        async with self._connection() as queries:
            return await queries.execute(sql, args)

    async def execute_many(self, sql: str, rows: Iterable[Args]) -> None:
        async with self.transaction() as queries:
            await queries.execute_many(sql, rows)

    async def insert(self, sql: str, args: Args = ()) -> int:
        async with self._connection() as queries:
            return await queries.insert(sql, args)

    async def schema(self, statement: str) -> None:
        async with self._connection() as queries:
            await queries.schema(statement)


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: is PostgreSQL running and listening there?"
    if isinstance(exc, socket.gaierror):
        return "no such host"
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, asyncpg.InvalidPasswordError):
        return "the password was refused"
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return f"{exc}; create it with `createdb`"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


@contextlib.asynccontextmanager
async def open_postgres(
    url: str, migrations: Sequence[Migration] = MIGRATIONS
) -> AsyncIterator[PostgresStore]:
    """Connect to the PostgreSQL store at url and bring its schema up to date (once, whichever server
    gets there first); a StoreError naming the address when it cannot be reached or used."""
    try:
        where = PostgresUrl.parse(url)
    except ValueError as exc:
        raise StoreError(f"`database` ({url}) is not a PostgreSQL address: {exc}") from None
    # min_size=0: connections are made when a statement needs one. With a floor, asyncpg reconnects in
    # the background while PostgreSQL is away and prints a traceback every second; the server's own
    # tasks already say, once, that the store is away.
    pool = await asyncpg.create_pool(
        url, min_size=0, max_size=POOL_SIZE, timeout=CONNECT_TIMEOUT_S, command_timeout=60
    )
    try:
        try:
            # The first connection, made here, so that an unreachable store stops the start.
            async with pool.acquire():
                pass
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(
                f"cannot reach the PostgreSQL store at {where} ({_reason(exc)}); check `database` in "
                "server.yaml, and that PostgreSQL runs there and lets this machine connect"
            ) from None
        store = PostgresStore(where, pool)
        try:
            await migrate(store, migrations)
        except NewerSchema as exc:
            raise StoreError(
                f"the store {where} is at schema version {exc.found}, newer than this llmgw knows "
                f"({exc.known}): a later release wrote it; run that release (or later) on every "
                "control plane that shares it"
            ) from None
        except asyncpg.PostgresError as exc:
            raise StoreError(f"cannot bring the store {where} up to date: {exc}") from None
        yield store
    finally:
        try:
            # close() waits for connections still in use; for a PostgreSQL that went away, a dead one
            # may never be given back, and the stop must not wait on it.
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await pool.close()
        except TimeoutError:
            pool.terminate()
