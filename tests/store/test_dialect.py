"""The store modules' SQL, written once, as each database reads it."""

from __future__ import annotations

from llmgw.store.dialect import POSTGRESQL, SQLITE


class TestPlaceholders:
    def test_sqlite_reads_the_query_as_written(self) -> None:
        sql = "SELECT * FROM users WHERE lower(email) = lower(?) AND id = ?"
        assert SQLITE.query(sql) == sql

    def test_postgresql_numbers_them_in_order(self) -> None:
        assert (
            POSTGRESQL.query("UPDATE t SET a = ?, b = ? WHERE id = ?")
            == "UPDATE t SET a = $1, b = $2 WHERE id = $3"
        )

    def test_a_question_mark_inside_quotes_is_text_not_a_placeholder(self) -> None:
        sql = "SELECT 'why?' || name, \"odd?col\" FROM t WHERE x = ? AND y = 'it''s ?'"
        assert (
            POSTGRESQL.query(sql)
            == "SELECT 'why?' || name, \"odd?col\" FROM t WHERE x = $1 AND y = 'it''s ?'"
        )

    def test_an_insert_returns_the_new_id_on_postgresql(self) -> None:
        assert POSTGRESQL.returning_id("INSERT INTO orgs (name) VALUES (?)") == (
            "INSERT INTO orgs (name) VALUES ($1) RETURNING id"
        )


class TestSchema:
    def test_sqlite_column_types_become_postgresqls_64_bit_and_sequenced_ones(self) -> None:
        statement = (
            "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE COLLATE NOCASE,"
            " is_admin INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL)"
        )
        assert POSTGRESQL.schema(statement) == (
            "CREATE TABLE users (id BIGSERIAL PRIMARY KEY, email TEXT NOT NULL UNIQUE,"
            " is_admin BIGINT NOT NULL DEFAULT 0, cost DOUBLE PRECISION NOT NULL)"
        )
        assert SQLITE.schema(statement) == statement

    def test_an_autoincrement_id_is_a_sequence_which_never_goes_back_either(self) -> None:
        statement = "CREATE TABLE later (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)"
        assert POSTGRESQL.schema(statement) == "CREATE TABLE later (id BIGSERIAL PRIMARY KEY, name TEXT)"
        assert SQLITE.schema(statement) == statement

    def test_only_postgresql_takes_a_lock_to_migrate(self) -> None:
        assert SQLITE.migration_lock is None
        assert POSTGRESQL.migration_lock is not None and "pg_advisory_xact_lock" in POSTGRESQL.migration_lock
