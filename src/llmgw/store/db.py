"""Opening the store: SQLite in one file (sqlite.py) or PostgreSQL (postgres.py), behind one Store."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from llmgw.config.database import is_postgres_url
from llmgw.store.base import Duplicate, IntegrityError, MissingReference, Queries, Row, Store
from llmgw.store.migrations import MIGRATIONS, Migration
from llmgw.store.postgres import open_postgres
from llmgw.store.sqlite import open_sqlite, unusable

__all__ = [
    "Duplicate",
    "IntegrityError",
    "MissingReference",
    "Queries",
    "Row",
    "Store",
    "open_store",
    "unusable",
]


@contextlib.asynccontextmanager
async def open_store(
    database: Path | str, migrations: Sequence[Migration] = MIGRATIONS, *, server: bool = False
) -> AsyncIterator[Store]:
    """Open the store database names: a `postgresql://` URL, or the path of an SQLite file (created
    with its directory if need be); its schema brought up to date either way.

    server: open it as the server does (for SQLite: alone, and checked whole first; sqlite.py).
    """
    if isinstance(database, str) and is_postgres_url(database):
        async with open_postgres(database, migrations) as store:
            yield store
    else:
        async with open_sqlite(Path(database), migrations, server=server) as sqlite_store:
            yield sqlite_store
