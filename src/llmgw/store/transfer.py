"""`llmgw store migrate`: every row of one store copied into another, SQLite to PostgreSQL or back.

Both stores are brought to the same (latest) schema when opened, so a table is copied column by
column with its ids as they are: keys, accounts and usage keep naming each other. The copy is one
transaction on the target: a failure leaves it as it was. Afterwards the target's id counters are
moved past the copied ids (dialect.realign_ids), or the next key made there would take an id in use,
and past every id the source ever gave out (store/ids.py): a project deleted there before the copy
keeps its usage, and its id must not go to the next project made on the target.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from llmgw.config.database import PostgresUrl, is_postgres_url
from llmgw.errors import StoreError
from llmgw.store.base import IntegrityError, Queries, Store
from llmgw.store.db import open_store
from llmgw.store.ids import keep_all_past, next_ids

# Rows a fresh store has from its migrations alone (the default org, team and project, the journal's
# mark): a target holding only these is empty.
_FRESH = {"orgs": 1, "teams": 1, "projects": 1, "usage_journal": 1}
# Parents before the tables whose foreign keys name them: PostgreSQL checks each row as it goes in.
_PARENTS_FIRST = ("orgs", "teams", "projects", "api_keys", "users")
# What the running gateways hold of each scope's allowance (gateway/allowance.py) belongs to them, not to
# the installation: a copied lease would hold allowance for a gateway that never runs on the copy. The
# same goes for the tables of the control planes sharing a PostgreSQL store (control/ha/leadership.py): a
# database servers have run on has them and an SQLite file never does, and a move must not stop there.
# The schema's own bookkeeping is the target's: its open applied and recorded every migration.
_NOT_COPIED = (
    "schema_version",
    "schema_expand_only",
    "allowance_leases",
    "llmgw_control_planes",
    "llmgw_routing",
)
_SQLITE = "sqlite://"


def store_location(text: str) -> Path | str:
    """`sqlite:///path/llmgw.db` (the path follows `sqlite://`) or `postgresql://…`, as open_store
    takes it; StoreError saying what is expected for anything else."""
    if is_postgres_url(text):
        try:
            PostgresUrl.parse(text)
        except ValueError as exc:
            raise StoreError(f"'{text}' is not a PostgreSQL address: {exc}") from None
        return text
    if text.startswith(_SQLITE) and len(text) > len(_SQLITE):
        return Path(text[len(_SQLITE) :])
    raise StoreError(
        f"'{text}' names no store: write sqlite:///PATH/llmgw.db for an SQLite file or "
        "postgresql://USER@HOST[:PORT]/DATABASE"
    )


def _shown(where: Path | str) -> str:
    return str(PostgresUrl.parse(where)) if isinstance(where, str) else f"{_SQLITE}{where}"


@contextlib.asynccontextmanager
async def _opened(where: Path | str, *, must_exist: bool) -> AsyncIterator[Store]:
    if must_exist and isinstance(where, Path) and not await asyncio.to_thread(where.is_file):
        raise StoreError(f"there is no SQLite store at {where}")
    async with open_store(where) as store:
        yield store


async def _tables(queries: Queries) -> list[str]:
    names = [str(row[0]) for row in await queries.fetch_all(queries.dialect.tables)]
    names = [n for n in names if n not in _NOT_COPIED]
    return [t for t in _PARENTS_FIRST if t in names] + sorted(n for n in names if n not in _PARENTS_FIRST)


async def _counts(queries: Queries, tables: list[str]) -> dict[str, int]:
    return {t: int(await queries.fetch_value(f"SELECT count(*) FROM {t}")) for t in tables}


def _held(counts: Mapping[str, int]) -> list[str]:
    """The tables that hold more than a fresh store's rows, as "table (N rows)"."""
    return [f"{t} ({n:,} rows)" for t, n in counts.items() if n != _FRESH.get(t, 0)]


async def copy_store(source: str, target: str, *, replace: bool = False) -> dict[str, int]:
    """Copy every table of source into target (each as store_location reads it); rows per table.

    Refused when target already holds data, unless replace: then what it holds is deleted first, in
    the same transaction as the copy.
    """
    where_from, where_to = store_location(source), store_location(target)
    if _shown(where_from) == _shown(where_to):
        raise StoreError("--from and --to name the same store; name the store to copy into with --to")
    async with (
        _opened(where_from, must_exist=True) as origin,
        _opened(where_to, must_exist=False) as destination,
    ):
        tables = await _tables(destination)
        missing = sorted(set(tables) - set(await _tables(origin)))
        if missing:
            raise StoreError(f"{_shown(where_from)} has no table {', '.join(missing)}; nothing was copied")
        # Read in one transaction on the source: on SQLite, its write lock keeps a running server's
        # writes out of the middle of the copy.
        async with origin.transaction() as reading:
            rows = {t: await reading.fetch_all(f"SELECT * FROM {t}") for t in tables}
            given = await next_ids(reading)
        async with destination.transaction() as writing:
            held = _held(await _counts(writing, tables))
            if held and not replace:
                raise StoreError(
                    f"{_shown(where_to)} already holds {', '.join(held)}: `llmgw store migrate` copies into "
                    "an empty store; add --replace to delete what it holds first"
                )
            for table in reversed(tables):
                await writing.execute(f"DELETE FROM {table}")
            # The leases of the gateways that ran on what is replaced: a budget's would hold its
            # allowance until the period ends.
            await writing.execute("DELETE FROM allowance_leases")
            for table in tables:
                if rows[table]:
                    try:
                        await _insert(writing, table, rows[table])
                    except IntegrityError as exc:
                        raise StoreError(
                            f"{_shown(where_to)} refused a row of {table} ({exc}); nothing was copied"
                        ) from None
            if writing.dialect.realign_ids is not None:
                await writing.execute(writing.dialect.realign_ids)
            await keep_all_past(writing, given)
        return {t: len(rows[t]) for t in tables}


async def _insert(writing: Queries, table: str, rows: list[Any]) -> None:
    columns = list(rows[0].keys())
    text = set(await _text_columns(writing, table))
    placeholders = ", ".join("?" for _ in columns)
    values = [
        tuple(
            str(v) if c in text and v is not None and not isinstance(v, str) else v
            for c, v in zip(columns, row, strict=True)
        )
        for row in rows
    ]
    await writing.execute_many(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders})", values)


async def _text_columns(writing: Queries, table: str) -> list[str]:
    """The target's text columns: SQLite keeps whatever a column was given, PostgreSQL takes text only
    as text."""
    if writing.dialect.text_columns is None:
        return []
    return [str(row[0]) for row in await writing.fetch_all(writing.dialect.text_columns, (table,))]
