"""`llmgw store migrate` copies every table, ids and all, into an empty store, in one transaction."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.store import store as store_command
from llmgw.control.ha.leadership import Leadership
from llmgw.errors import StoreError
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.catalog import put_model
from llmgw.store.keys import create_key, list_keys, revoke_key
from llmgw.store.prices import set_price
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scale import note_requests
from llmgw.store.scopes import Scope, create_org, create_project, create_team, delete
from llmgw.store.sessions import create_session
from llmgw.store.sqlite import SqliteStore
from llmgw.store.transfer import copy_store
from llmgw.store.upgrades import keep_roll
from llmgw.store.users import authenticate, create_user, link_key

from ..waiting import eventually


async def _fill(store: Store) -> str:
    """A store with a row in every table, and gaps in its ids (a deleted org); a key's plaintext."""
    await create_org(store, "gone")
    org = await create_org(store, "acme")
    team = await create_team(store, org.id, "ml")
    project = await create_project(store, team.id, "chat")
    plaintext, key = await create_key(store, "ci", project_id=project.id, models=["sim-chat"])
    _, old = await create_key(store, "old")
    await revoke_key(store, old.prefix)
    user = await create_user(store, "Ann@Example.com", "password1", status="active", project_id=project.id)
    await link_key(store, key.id, user.id)
    await create_session(store, user.id, ttl_s=3600)
    await set_limits(store, Scope("project", project.id), rpm=60, tpm=None)
    await set_budget(store, Scope("org", org.id), 12.5, "month")
    await set_price(store, "sim-chat", 0.5, 1.25)
    await put_model(store, "added", "name: added\n", "added.yaml")
    await keep_roll(store, '{"state":"done"}')
    await note_requests(store, {"added": 1000.0}, {})
    recorder = UsageRecorder()
    recorder.record(key.id, project.id, "sim-chat", 200, 10, 5, 0.25, 12.0)
    recorder.record(key.id, project.id, "sim-chat", 429, 0, 0, 0.0, 0.0)
    # A deleted project's usage, and the team and org it still counts toward.
    deleted = await create_project(store, team.id, "deleted")
    recorder.record(0, deleted.id, "sim-chat", 200, 1, 1, 0.5, 1.0)
    await recorder.flush(store)
    await delete(store, Scope("project", deleted.id))
    # A server's journal mark goes with the usage: that server, moved to the copy, replays nothing twice.
    async with store.transaction() as db:
        await db.execute("INSERT INTO usage_journal_marks (journal_id, applied_seq) VALUES ('j', 7)")
    async with store.transaction() as db:
        await db.execute("DELETE FROM orgs WHERE name = 'gone'")
    return plaintext


async def _contents(database: Path | str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table but the schema's own, in a stable order, as plain values."""
    async with open_store(database) as store:
        tables = [str(r[0]) for r in await store.fetch_all(store.dialect.tables)]
        return {
            table: sorted((tuple(row) for row in await store.fetch_all(f"SELECT * FROM {table}")), key=repr)
            for table in tables
            if table != "schema_version"
        }


def _sqlite(path: Path) -> str:
    return f"sqlite://{path}"


class TestCopy:
    async def test_sqlite_to_postgresql_and_back_keeps_every_row_and_id(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        source = tmp_path / "old.db"
        async with open_store(source) as store:
            plaintext = await _fill(store)
        copied = await copy_store(_sqlite(source), postgres_url)
        assert copied["api_keys"] == 2 and copied["orgs"] == 2 and copied["usage_daily"] == 3
        assert all(n > 0 for n in copied.values()), copied
        back = tmp_path / "back.db"
        await copy_store(postgres_url, _sqlite(back))
        assert await _contents(back) == await _contents(source)
        async with open_store(postgres_url) as store:
            # The copy works as a store: the key, the account, and new rows after the copied ids.
            assert [k.name for k in await list_keys(store)] == ["ci", "old"]
            assert await authenticate(store, "ann@example.com", "password1") is not None
            org = await create_org(store, "next")
            assert org.id == 4  # after acme's 3, not the deleted org's 2 nor the default's 1
            _, key = await create_key(store, "new")
            assert key.id == 3
        assert plaintext

    async def test_a_target_that_holds_data_is_refused_unless_told_to_replace_it(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        source = tmp_path / "old.db"
        async with open_store(source) as store:
            await _fill(store)
        async with open_store(postgres_url) as store:
            await create_key(store, "already-there")
        with pytest.raises(StoreError, match=r"already holds api_keys \(1 rows\).*add --replace"):
            await copy_store(_sqlite(source), postgres_url)
        async with open_store(postgres_url) as store:
            assert [k.name for k in await list_keys(store)] == ["already-there"]
        await copy_store(_sqlite(source), postgres_url, replace=True)
        async with open_store(postgres_url) as store:
            assert [k.name for k in await list_keys(store)] == ["ci", "old"]

    async def test_the_gateways_leases_are_not_copied_and_a_replaced_stores_are_forgotten(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        """What gateways hold of each scope's allowance belongs to those gateways, not to the data."""
        lease = (
            "INSERT INTO allowance_leases (scope, kind, holder, units, expires_at)"
            " VALUES ('project:1', 'requests', 'gw', 30, 1e18)"
        )
        source = tmp_path / "old.db"
        async with open_store(source) as store:
            await _fill(store)
            await store.execute(lease)
        async with open_store(postgres_url) as store:
            await store.execute(lease)
        copied = await copy_store(_sqlite(source), postgres_url, replace=True)
        assert "allowance_leases" not in copied
        async with open_store(postgres_url) as store:
            assert await store.fetch_all("SELECT * FROM allowance_leases") == []

    async def test_control_planes_own_tables_neither_block_nor_join_a_move(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        """Who leads and the routing table it published describe the servers that ran on a database,
        not its data: a move into a database servers have already used, and back out of it, succeeds
        and leaves them out."""
        async with Leadership(postgres_url, "cp1", "127.0.0.1:7443", poll_s=0.1) as leadership:
            await eventually(lambda: leadership.leading)
        source = tmp_path / "old.db"
        async with open_store(source) as store:
            await _fill(store)
        into = await copy_store(_sqlite(source), postgres_url, replace=True)
        back = tmp_path / "back.db"
        out = await copy_store(postgres_url, _sqlite(back))
        assert not {"llmgw_control_planes", "llmgw_routing"} & (set(into) | set(out))
        assert await _contents(back) == await _contents(source)

    async def test_a_copy_that_fails_halfway_leaves_the_target_as_it_was(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        """One transaction: a row the target refuses (one naming an account that is not there, which
        an SQLite file written without its foreign keys on can hold) undoes every table before it."""
        source = tmp_path / "old.db"
        async with open_store(source) as store:
            await create_key(store, "ci")
            assert isinstance(store, SqliteStore)
            await store.db.execute("PRAGMA foreign_keys = OFF")
            async with store.transaction() as db:
                await db.execute("INSERT INTO user_keys (key_id, user_id) VALUES (1, 99)")
        with pytest.raises(StoreError, match=r"refused a row of user_keys \(.*\); nothing was copied"):
            await copy_store(_sqlite(source), postgres_url)
        async with open_store(postgres_url) as store:
            assert await list_keys(store) == []

    async def test_a_source_that_does_not_exist_is_refused_and_not_created(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        with pytest.raises(StoreError, match="there is no SQLite store at"):
            await copy_store(_sqlite(tmp_path / "missing.db"), postgres_url)
        assert not await asyncio.to_thread((tmp_path / "missing.db").exists)

    @pytest.mark.parametrize(
        ("text", "said"),
        [
            ("/var/lib/llmgw/llmgw.db", "names no store: write sqlite:///PATH/llmgw.db"),
            ("mysql://root@db/llmgw", "names no store"),
            ("postgresql://db.internal/llmgw", "it names no user"),
        ],
    )
    async def test_a_store_written_wrongly_is_refused_saying_how_to_write_it(
        self, tmp_path: Path, text: str, said: str
    ) -> None:
        with pytest.raises(StoreError, match=said):
            await copy_store(text, _sqlite(tmp_path / "new.db"))


class TestCommand:
    def test_it_says_how_many_rows_each_table_had(self, tmp_path: Path, postgres_url: str) -> None:
        source = tmp_path / "old.db"

        async def fill() -> None:
            async with open_store(source) as store:
                await _fill(store)

        asyncio.run(fill())
        result = CliRunner().invoke(
            store_command, ["migrate", "--from", _sqlite(source), "--to", postgres_url]
        )
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert any(line.split() == ["api_keys", "2", "rows"] for line in lines), result.output
        assert lines[-1].startswith("copied ") and "point `database` at the new store" in lines[-1]
        again = CliRunner().invoke(
            store_command, ["migrate", "--from", _sqlite(source), "--to", postgres_url]
        )
        assert again.exit_code == 1
        assert "already holds" in again.output
