"""What every store offers its modules, whichever database is under it (sqlite.py, postgres.py).

The store modules (keys.py, users.py, ...) write their SQL once, with `?` placeholders, and run it
through these methods; each backend translates it for its database (dialect.py) and turns its
driver's errors into the few below, so no module catches sqlite3's or asyncpg's exceptions.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from llmgw.errors import StoreError
from llmgw.store.dialect import Dialect

Args = Sequence[Any]


class Row(Protocol):
    """A row read back: its columns by name or by position (sqlite3.Row and asyncpg.Record both are)."""

    def __getitem__(self, key: Any, /) -> Any: ...

    def __len__(self) -> int: ...


class IntegrityError(Exception):
    """A write the schema refused (a constraint); the caller says what it means for the person."""


class Duplicate(IntegrityError):
    """A UNIQUE or PRIMARY KEY value that is already taken."""


class MissingReference(IntegrityError):
    """A FOREIGN KEY naming a row that is not there."""


class NotCommitted(StoreError):
    """A write transaction that failed before its COMMIT was sent (the connection refused, a statement
    failed): the database certainly has none of it. Any other failure of a write may have committed."""


class Queries(abc.ABC):
    """Statements, run in a transaction or (on the store itself) each on its own."""

    dialect: Dialect

    @abc.abstractmethod
    async def fetch_all(self, sql: str, args: Args = ()) -> list[Row]: ...

    @abc.abstractmethod
    async def fetch_one(self, sql: str, args: Args = ()) -> Row | None: ...

    async def fetch_value(self, sql: str, args: Args = ()) -> Any:
        """The first column of the first row; None when there is no row."""
        row = await self.fetch_one(sql, args)
        return row[0] if row is not None else None

    @abc.abstractmethod
    async def execute(self, sql: str, args: Args = ()) -> int:
        """Run one statement; how many rows it changed."""

    @abc.abstractmethod
    async def execute_many(self, sql: str, rows: Iterable[Args]) -> None: ...

    @abc.abstractmethod
    async def insert(self, sql: str, args: Args = ()) -> int:
        """Run an INSERT of one row into a table with an `id`; the id the database gave it."""

    @abc.abstractmethod
    async def schema(self, statement: str) -> None:
        """Run a migration's statement, written for SQLite, translated for this database."""


class Store(Queries):
    """The open store. Modules per aggregate (store/keys.py, ...) take it as their first argument."""

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """The store as a person names it: the file, or the PostgreSQL address (never its password)."""

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[Queries]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
