"""Where SQLite and PostgreSQL differ, in one place: the store modules write one copy of each query.

The store modules write SQL that both databases read the same way: `?` placeholders, `lower(x)`
rather than `COLLATE NOCASE`, `ON CONFLICT ... DO UPDATE` with the table's own columns named
`table.column`, days and times as ISO text, booleans as 0 and 1. What cannot be written once is
translated here: placeholders become `$1, $2, ...` for asyncpg, and the migrations' SQLite column
types become PostgreSQL's (64-bit integers, as SQLite's are; a sequence behind every id).
"""

from __future__ import annotations

import functools
import re
from typing import Literal

import attrs

DialectName = Literal["sqlite", "postgresql"]

# Any key of one number: the migration lock is per database. The leadership of several control
# planes takes others (control/ha/leadership.py).
_MIGRATION_LOCK = 0x6C6C6D67_77000001  # "llmgw" and 1

# A quoted string or identifier, or a placeholder: a `?` inside quotes is text, not a placeholder.
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?")

# SQLite's column types in the migrations, as PostgreSQL spells them. INTEGER PRIMARY KEY is SQLite's
# alias of the row id, numbered by the database when an insert leaves it out: a sequence in
# PostgreSQL. Every INTEGER is 64 bits in SQLite, and a day's token count may pass 2**31.
_SCHEMA = (
    # AUTOINCREMENT (SQLite never gives a deleted row's id again) is what a sequence does already.
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bINTEGER PRIMARY KEY\b"), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    # A case-blind unique email is the lower(email) index of migration 7 on both.
    (re.compile(r"\s+COLLATE NOCASE\b"), ""),
)

# After rows were written with ids of their own (the default org, team and project of migration 3;
# every row `llmgw store migrate` copies), each sequence is moved past the highest id, or the next
# insert would take an id that is already there. Never back: a sequence past the highest row has given
# out the ids of rows deleted since, and a new row must not take one (store/ids.py says why). The table
# is locked against inserts meanwhile, or one could take an id between the read and the move.
_REALIGN_IDS = """
DO $$
DECLARE r record; next_id bigint;
BEGIN
    FOR r IN
        SELECT c.table_name, c.column_name,
               pg_get_serial_sequence(quote_ident(c.table_name), c.column_name) AS seq
        FROM information_schema.columns c
        WHERE c.table_schema = current_schema() AND c.column_default LIKE 'nextval(%'
    LOOP
        EXECUTE format('LOCK TABLE %I IN SHARE ROW EXCLUSIVE MODE', r.table_name);
        EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s', r.seq)
            INTO next_id;
        EXECUTE format('SELECT setval(%L, GREATEST(%s, COALESCE((SELECT MAX(%I) FROM %I), 0) + 1), false)',
                       r.seq, next_id, r.column_name, r.table_name);
    END LOOP;
END
$$
"""


@attrs.frozen
class Dialect:
    name: DialectName

    def query(self, sql: str) -> str:
        """sql, written with `?` placeholders, as this database reads it."""
        return sql if self.name == "sqlite" else _numbered(sql)

    def schema(self, statement: str) -> str:
        """A migration's statement, written for SQLite, as this database reads it."""
        if self.name == "sqlite":
            return statement
        for pattern, replacement in _SCHEMA:
            statement = pattern.sub(replacement, statement)
        return statement

    def returning_id(self, sql: str) -> str:
        """An INSERT that also returns the id the database gave the new row."""
        return sql if self.name == "sqlite" else _numbered(sql + " RETURNING id")

    @property
    def migration_lock(self) -> str | None:
        """The statement that makes a second server wait while the first applies the migrations.

        SQLite's BEGIN IMMEDIATE already does; PostgreSQL lets two transactions both find the schema
        table empty and both apply migration 1, unless they queue on a lock first. A transaction-level
        advisory lock is released by COMMIT, ROLLBACK or a dead connection, so it never outlives a
        server that died holding it.
        """
        return None if self.name == "sqlite" else f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"

    @property
    def realign_ids(self) -> str | None:
        """The statement that moves every id sequence past the ids already in the tables, never back."""
        return None if self.name == "sqlite" else _REALIGN_IDS

    @property
    def text_columns(self) -> str | None:
        """A query for the text columns of the table its one argument names; None where any column
        takes any value (SQLite)."""
        if self.name == "sqlite":
            return None
        return (
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ? AND data_type = 'text'"
        )

    @property
    def tables(self) -> str:
        """A query for the names of the store's tables, schema_version among them."""
        if self.name == "sqlite":
            return (
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        return "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"


SQLITE = Dialect("sqlite")
POSTGRESQL = Dialect("postgresql")


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> str:
    """`?` placeholders as `$1, $2, ...`; cached, because the store modules' queries are few and fixed."""
    counter = 0

    def number(match: re.Match[str]) -> str:
        nonlocal counter
        if match.group(0) != "?":
            return match.group(0)
        counter += 1
        return f"${counter}"

    return _TOKENS.sub(number, sql)
