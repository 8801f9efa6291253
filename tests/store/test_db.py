"""The store applies each migration exactly once, on SQLite (in WAL mode) and on PostgreSQL alike."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from llmgw.errors import StoreError
from llmgw.store import open_store
from llmgw.store.migrations import MIGRATIONS, Migration, schema_version
from llmgw.store.scopes import create_org
from llmgw.store.sqlite import SqliteStore


async def _versions(database: Path | str, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    async with open_store(database, migrations) as store:
        return [
            row[0] for row in await store.fetch_all("SELECT version FROM schema_version ORDER BY version")
        ]


class TestOpenStore:
    async def test_a_new_store_is_created_with_its_directory_and_uses_write_ahead_logging(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "state" / "llmgw.db"
        async with open_store(path) as store:
            assert isinstance(store, SqliteStore)
            async with store.db.execute("PRAGMA journal_mode") as cursor:
                row = await cursor.fetchone()
            assert row is not None and row[0] == "wal"
        assert path.exists()

    async def test_every_migration_is_applied_at_the_first_open(self, database: Path | str) -> None:
        assert await _versions(database) == list(range(1, len(MIGRATIONS) + 1))

    async def test_reopening_applies_nothing_again(self, database: Path | str) -> None:
        first = await _versions(database)
        # A second run of migration 1 would fail: CREATE TABLE api_keys exists.
        assert await _versions(database) == first

    async def test_a_later_release_applies_only_its_new_migration(self, database: Path | str) -> None:
        await _versions(database)
        later = (
            *MIGRATIONS,
            Migration("creates table added_later", ("CREATE TABLE added_later (x INTEGER)",)),
        )
        assert await _versions(database, later) == list(range(1, len(later) + 1))
        async with open_store(database, later) as store:
            assert await store.fetch_value("SELECT count(*) FROM added_later") == 0

    async def test_a_failing_migration_leaves_nothing_half_applied(self, database: Path | str) -> None:
        await _versions(database)
        broken = (
            *MIGRATIONS,
            Migration("fails half way", ("CREATE TABLE half (x INTEGER)", "THIS IS NOT SQL")),
        )
        with pytest.raises(StoreError, match=r"cannot (open|bring) the store"):
            async with open_store(database, broken):
                pass
        async with open_store(database) as store:
            assert await schema_version(store) == len(MIGRATIONS)
            tables = [row[0] for row in await store.fetch_all(store.dialect.tables)]
            assert "half" not in tables and "api_keys" in tables

    async def test_a_store_written_by_a_later_release_is_refused_with_a_sentence(
        self, database: Path | str
    ) -> None:
        await _versions(
            database, (*MIGRATIONS, Migration("retires prices", ("DROP TABLE prices",), unused_since="0.1"))
        )
        with pytest.raises(StoreError, match="newer than this llmgw knows"):
            async with open_store(database):
                pass

    async def test_a_store_a_later_release_only_expanded_is_still_opened_and_used_by_this_one(
        self, database: Path | str
    ) -> None:
        """A server of this release restarted in the middle of a roll, or brought back by a roll back."""
        later = Migration("creates table future", ("CREATE TABLE future (x INTEGER)",))
        await _versions(database, (*MIGRATIONS, later))
        async with open_store(database) as store:
            assert await schema_version(store) == len(MIGRATIONS) + 1
            assert (await create_org(store, "acme")).name == "acme"

    async def test_servers_opening_a_new_store_at_once_apply_each_migration_once(
        self, database: Path | str
    ) -> None:
        """Whichever gets there first migrates; the others wait for it and find nothing left to do."""
        opened = await asyncio.gather(*(_versions(database) for _ in range(4)))
        assert opened == [list(range(1, len(MIGRATIONS) + 1))] * 4

    async def test_new_rows_are_numbered_after_the_rows_a_migration_wrote_with_their_own_ids(
        self, database: Path | str
    ) -> None:
        """Migration 3 writes the default org as id 1; the next org must not be given id 1 again."""
        async with open_store(database) as store:
            assert (await create_org(store, "acme")).id == 2
        async with open_store(database) as store:
            assert (await create_org(store, "globex")).id == 3

    async def test_a_server_holds_its_store_alone_and_commands_still_open_it(self, tmp_path: Path) -> None:
        path = tmp_path / "llmgw.db"
        async with open_store(path, server=True):
            with pytest.raises(StoreError, match="is in use by another llmgw server on this machine"):
                async with open_store(path, server=True):
                    pass
            async with open_store(path) as command:
                assert await schema_version(command) == len(MIGRATIONS)
        async with open_store(path, server=True):
            pass  # released when the first server closed it

    async def test_a_damaged_page_met_inside_the_block_ends_it_with_the_sentence(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "llmgw.db"
        with pytest.raises(StoreError, match=r"is damaged \(database disk image is malformed\): stop every"):
            async with open_store(path):
                raise sqlite3.DatabaseError("database disk image is malformed")

    async def test_a_transaction_that_raises_is_rolled_back(self, database: Path | str) -> None:
        async with open_store(database) as store:
            with pytest.raises(RuntimeError):
                async with store.transaction() as db:
                    await db.execute(
                        "INSERT INTO api_keys (name, prefix, key_hash, created_at)"
                        " VALUES ('a', 'p', 'h', 't')"
                    )
                    raise RuntimeError("abandon")
            assert await store.fetch_value("SELECT count(*) FROM api_keys") == 0
