"""Ids that are never given out twice: a deleted project's, key's or account's id stays its own.

Usage, budgets, limits and sign-in sessions are filed under the ids of orgs, teams, projects, keys and
accounts, and are kept when what they name is deleted (usage of a deleted project stays its own row).
A new row given a deleted one's id would inherit all of it: a new project the old one's requests, and a
budget that starts at what the old one spent. PostgreSQL's sequences never go back on their own; SQLite
gives an INTEGER PRIMARY KEY table's highest id again once that row is gone, unless the table is
AUTOINCREMENT, when it keeps the highest id it ever gave in sqlite_sequence. Migration 11 rebuilds the
tables so (NeverReuseIds); these functions read and move each database's counter for the migration and
for `llmgw store migrate`, which must carry one store's counters into the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llmgw.errors import StoreError
from llmgw.store.base import Queries
from llmgw.store.schema_changes import NeverReuseIds

# The tables whose ids other records are filed under; each has an `id` numbered by the database.
ID_TABLES = ("orgs", "teams", "projects", "api_keys", "users")

_TABLE_HEAD = re.compile(r'^\s*CREATE TABLE\s+"?(\w+)"?', re.I)
_ROWID_KEY = re.compile(r"\bid INTEGER PRIMARY KEY\b", re.I)
_AUTOINCREMENT = re.compile(r"\bAUTOINCREMENT\b", re.I)


async def never_reuse(db: Queries, step: NeverReuseIds) -> None:
    """Carry out a migration's NeverReuseIds step, in the migration's transaction."""
    if db.dialect.name == "sqlite":
        await _rebuild_with_autoincrement(db, step.table)
    named = [await db.fetch_value(query) for query in step.named_by]
    await keep_past(db, step.table, max([0, *(int(value) for value in named if value is not None)]))


async def next_ids(db: Queries) -> dict[str, int]:
    """The lowest id the database may still give a new row, per table of ID_TABLES."""
    return {table: await _next_id(db, table) for table in ID_TABLES}


async def keep_past(db: Queries, table: str, highest: int) -> None:
    """Never give a new row of table an id of highest or below; a counter already past it stays.

    In a transaction: on PostgreSQL the table is locked against inserts until it ends, or an insert
    between reading the sequence and moving it could take an id the move then gives again.
    """
    if db.dialect.name == "sqlite":
        given = await db.fetch_value("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))
        if given is None:
            await db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, highest))
        elif int(given) < highest:
            await db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (highest, table))
        return
    await db.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
    if await _next_id(db, table) <= highest:
        sequence = await _sequence(db, table)
        await db.fetch_value("SELECT setval(?::regclass, ?, false)", (sequence, highest + 1))


async def keep_all_past(db: Queries, next_by_table: Mapping[str, int]) -> None:
    """keep_past for every table of next_by_table (next_ids of another store, after a copy from it)."""
    for table, next_id in next_by_table.items():
        await keep_past(db, table, next_id - 1)


async def _next_id(db: Queries, table: str) -> int:
    if db.dialect.name == "sqlite":
        # Before migration 11 a store has no sqlite_sequence: the highest row is all SQLite goes by.
        highest = int(await db.fetch_value(f"SELECT COALESCE(MAX(id), 0) FROM {table}"))
        if await db.fetch_one("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'") is not None:
            given = await db.fetch_value("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))
            highest = max(highest, int(given or 0))
        return highest + 1
    row = await db.fetch_one(f"SELECT last_value, is_called FROM {await _sequence(db, table)}")
    assert row is not None
    return int(row[0]) + 1 if row[1] else int(row[0])


async def _sequence(db: Queries, table: str) -> str:
    """The PostgreSQL sequence that numbers table's ids, schema-qualified and quoted as need be."""
    return str(await db.fetch_value("SELECT pg_get_serial_sequence(?, 'id')", (table,)))


async def _rebuild_with_autoincrement(db: Queries, table: str) -> None:
    """Make table AUTOINCREMENT, the only change: SQLite's own recipe, a copy under the table's name
    (sqlite.org/lang_altertable.html, "Making Other Kinds Of Table Schema Changes")."""
    created = await db.fetch_value(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    )
    if created is None or _AUTOINCREMENT.search(created):
        return
    # Dropping the old table with foreign keys on would first delete its rows, and ON DELETE CASCADE
    # with them every row that names them (a user's keys, a key's owner): sqlite.py migrates with them
    # off, and checks them at the end of this step instead.
    if await db.fetch_value("PRAGMA foreign_keys"):
        raise RuntimeError(f"rebuilding {table} with foreign keys on would delete the rows that name it")
    rebuilt = f"llmgw_rebuilt_{table}"
    statement, heads = _TABLE_HEAD.subn(f"CREATE TABLE {rebuilt}", created, count=1)
    statement, keys = _ROWID_KEY.subn("id INTEGER PRIMARY KEY AUTOINCREMENT", statement)
    if heads != 1 or keys != 1:
        raise StoreError(
            f"the table {table} of the store is not as llmgw made it ({' '.join(created.split())}), so "
            "llmgw cannot keep its deleted ids from being given out again; restore a backup of the store"
        )
    columns = ", ".join(
        '"' + str(row["name"]).replace('"', '""') + '"'
        for row in await db.fetch_all(f"PRAGMA table_info({table})")
    )
    # Its indexes and triggers go with the old table: made again, as they were, on the new one.
    attached = [
        str(row[0])
        for row in await db.fetch_all(
            "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger')"
            " AND sql IS NOT NULL",
            (table,),
        )
    ]
    dangling = await db.fetch_value("SELECT count(*) FROM pragma_foreign_key_check")
    await db.execute(statement)
    # AUTOINCREMENT counts explicit ids too: the copy leaves sqlite_sequence at the highest row.
    await db.execute(f"INSERT INTO {rebuilt} ({columns}) SELECT {columns} FROM {table}")
    await db.execute(f"DROP TABLE {table}")
    # Other tables' REFERENCES name the table by its name, so they name the rebuilt one once renamed.
    await db.execute(f"ALTER TABLE {rebuilt} RENAME TO {table}")
    for sql in attached:
        await db.execute(sql)
    if await db.fetch_value("SELECT count(*) FROM pragma_foreign_key_check") != dangling:
        raise StoreError(
            f"rebuilding the table {table} of the store would leave rows naming rows that are not there; "
            "nothing was changed"
        )
