"""The store opens in WAL mode and applies each migration exactly once."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from llmgw.errors import StoreError
from llmgw.store import open_store
from llmgw.store.migrations import MIGRATIONS, Migration, schema_version


async def _versions(path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    async with (
        open_store(path, migrations) as store,
        store.db.execute("SELECT version FROM schema_version ORDER BY version") as cursor,
    ):
        return [row[0] for row in await cursor.fetchall()]


class TestOpenStore:
    async def test_a_new_store_is_created_with_its_directory_and_uses_write_ahead_logging(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "state" / "llmgw.db"
        async with open_store(path) as store:
            async with store.db.execute("PRAGMA journal_mode") as cursor:
                row = await cursor.fetchone()
            assert row is not None and row[0] == "wal"
        assert path.exists()

    async def test_every_migration_is_applied_at_the_first_open(self, tmp_path: Path) -> None:
        assert await _versions(tmp_path / "llmgw.db") == list(range(1, len(MIGRATIONS) + 1))

    async def test_reopening_applies_nothing_again(self, tmp_path: Path) -> None:
        path = tmp_path / "llmgw.db"
        first = await _versions(path)
        # A second run of migration 1 would fail: CREATE TABLE api_keys exists.
        assert await _versions(path) == first

    async def test_a_later_release_applies_only_its_new_migration(self, tmp_path: Path) -> None:
        path = tmp_path / "llmgw.db"
        await _versions(path)
        later = (*MIGRATIONS, ("CREATE TABLE added_later (x INTEGER)",))
        assert await _versions(path, later) == list(range(1, len(later) + 1))
        async with (
            open_store(path, later) as store,
            store.db.execute("SELECT count(*) FROM added_later") as cursor,
        ):
            assert await cursor.fetchone() is not None

    async def test_a_failing_migration_leaves_nothing_half_applied(self, tmp_path: Path) -> None:
        path = tmp_path / "llmgw.db"
        await _versions(path)
        broken = (*MIGRATIONS, ("CREATE TABLE half (x INTEGER)", "THIS IS NOT SQL"))
        with pytest.raises(StoreError, match="cannot open the store"):
            async with open_store(path, broken):
                pass
        async with open_store(path) as store:
            assert await schema_version(store.db) == len(MIGRATIONS)
            async with store.db.execute("SELECT name FROM sqlite_master WHERE name = 'half'") as cursor:
                assert await cursor.fetchone() is None

    async def test_a_store_written_by_a_later_release_is_refused_with_a_sentence(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "llmgw.db"
        await _versions(path, (*MIGRATIONS, ("CREATE TABLE future (x INTEGER)",)))
        with pytest.raises(StoreError, match="newer than this llmgw knows"):
            async with open_store(path):
                pass

    async def test_a_server_holds_its_store_alone_and_commands_still_open_it(self, tmp_path: Path) -> None:
        path = tmp_path / "llmgw.db"
        async with open_store(path, server=True):
            with pytest.raises(StoreError, match="is in use by another llmgw server on this machine"):
                async with open_store(path, server=True):
                    pass
            async with open_store(path) as command:
                assert await schema_version(command.db) == len(MIGRATIONS)
        async with open_store(path, server=True):
            pass  # released when the first server closed it

    async def test_a_damaged_page_met_inside_the_block_ends_it_with_the_sentence(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "llmgw.db"
        with pytest.raises(StoreError, match=r"is damaged \(database disk image is malformed\): stop every"):
            async with open_store(path):
                raise sqlite3.DatabaseError("database disk image is malformed")

    async def test_a_transaction_that_raises_is_rolled_back(self, tmp_path: Path) -> None:
        async with open_store(tmp_path / "llmgw.db") as store:
            with pytest.raises(RuntimeError):
                async with store.transaction() as db:
                    await db.execute(
                        "INSERT INTO api_keys (name, prefix, key_hash, created_at)"
                        " VALUES ('a', 'p', 'h', 't')"
                    )
                    raise RuntimeError("abandon")
            async with store.db.execute("SELECT count(*) FROM api_keys") as cursor:
                row = await cursor.fetchone()
            assert row is not None and row[0] == 0
