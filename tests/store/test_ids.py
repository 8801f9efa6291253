"""An id is never given out twice: what is filed under a deleted project, key or account stays its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.ids import ID_TABLES
from llmgw.store.keys import create_key, revoke_key
from llmgw.store.migrations import MIGRATIONS, Migration, schema_version
from llmgw.store.scopes import Project, Scope, ScopeInUse, UnknownScope, create_org, create_project, delete
from llmgw.store.sessions import create_session, lookup_session
from llmgw.store.transfer import copy_store
from llmgw.store.usage import usage_totals
from llmgw.store.users import create_user, link_key
from llmgw.tenancy import operations

# The last release's schema, which gave the highest id again once its row was deleted (on SQLite).
BEFORE_IDS_WERE_KEPT = tuple(MIGRATIONS[:10])
IDS_KEPT = tuple(MIGRATIONS[:11])


async def _delete_as_an_earlier_release(store: Store, name: str) -> None:
    """Delete a project as the releases before migration 12 did: its row goes, nothing records its team."""
    async with store.transaction() as db:
        await db.execute("DELETE FROM projects WHERE name = ?", (name,))


async def _spend_and_delete_victim(store: Store, *, earlier_release: bool = False) -> int:
    """The issue's steps: project `victim` in team `ml` spends 0.012 in 3 requests with its key, the key
    is revoked and the project deleted (earlier_release: as a release before migration 12 did); its id."""
    await operations.create(store, "team", "ml", "default")
    victim = await operations.create(store, "project", "victim", "ml")
    _, key = await create_key(store, "victim-key", project_id=victim.id)
    recorder = UsageRecorder()
    for _ in range(3):
        recorder.record(key.id, victim.id, "sim-chat", 200, 10, 5, 0.004, 12.0)
    await recorder.flush(store)
    await revoke_key(store, key.prefix)
    if earlier_release:
        await _delete_as_an_earlier_release(store, "victim")
    else:
        await operations.delete(store, "project", "victim")
    return victim.id


async def _attacker_inherits_nothing(store: Store, victim_id: int) -> None:
    """A project made next in the same team: a new id, no usage, and a budget that starts at nothing,
    while the victim's usage stays a row of its own."""
    attacker = await operations.create(store, "project", "attacker", "ml")
    assert attacker.id > victim_id
    rows = {row.id: row for row in await operations.usage(store, "project")}
    assert str(attacker.id) not in rows
    victims = rows[str(victim_id)]
    assert (victims.name, victims.requests, victims.cost) == (f"project {victim_id}", 3, pytest.approx(0.012))
    await operations.set_quota(store, "project:attacker", budget=1.0, period="total")
    quotas = Quotas(UsageRecorder())
    await quotas.refresh(store)
    assert quotas.spent(Scope("project", attacker.id)) == 0.0


class TestADeletedIdIsNotGivenAgain:
    async def test_a_project_made_after_one_was_deleted_inherits_neither_its_usage_nor_its_spending(
        self, store: Store
    ) -> None:
        await _attacker_inherits_nothing(store, await _spend_and_delete_victim(store))

    @pytest.mark.parametrize("kind", ["org", "team", "project"])
    async def test_an_org_team_or_project_made_after_the_highest_was_deleted_gets_an_id_of_its_own(
        self, store: Store, kind: operations.Level
    ) -> None:
        parent = "" if kind == "org" else "default"
        gone = await operations.create(store, kind, "gone", parent)
        await operations.delete(store, kind, "gone")
        made = await operations.create(store, kind, "made", parent)
        assert made.id > gone.id

    async def test_a_key_made_after_the_highest_was_removed_takes_neither_its_id_nor_its_usage(
        self, store: Store
    ) -> None:
        """No command deletes a key (a revoked one stays listed); one removed by hand must not hand on
        its id all the same."""
        _, old = await create_key(store, "old")
        recorder = UsageRecorder()
        recorder.record(old.id, 1, "sim-chat", 200, 10, 5, 0.5, 12.0)
        await recorder.flush(store)
        async with store.transaction() as db:
            await db.execute("DELETE FROM api_keys WHERE id = ?", (old.id,))
        _, new = await create_key(store, "new")
        assert new.id > old.id
        totals = {total.group: total for total in await usage_totals(store, "key")}
        assert new.id not in totals and totals[old.id].requests == 1

    async def test_an_account_made_after_the_highest_was_removed_takes_neither_its_id_nor_its_sessions(
        self, store: Store
    ) -> None:
        old = await create_user(store, "old@example.com", "password one", status="active")
        token, _ = await create_session(store, old.id, ttl_s=3600)
        async with store.transaction() as db:
            await db.execute("DELETE FROM users WHERE id = ?", (old.id,))
        new = await create_user(store, "new@example.com", "password two", status="active")
        assert new.id > old.id
        assert await lookup_session(store, token) is None

    async def test_projects_made_while_the_highest_are_deleted_never_take_a_deleted_id(
        self, store: Store
    ) -> None:
        team = await operations.create(store, "team", "ml", "default")
        first = [await create_project(store, team.id, f"first-{n}") for n in range(6)]

        async def replace(project: Project, n: int) -> int:
            await delete(store, Scope("project", project.id))
            return (await create_project(store, team.id, f"next-{n}")).id

        made = await asyncio.gather(*(replace(project, n) for n, project in enumerate(first)))
        assert len(set(made)) == len(first)
        assert min(made) > max(p.id for p in first)

    async def test_a_later_migration_moves_no_id_counter_back(self, database: Path | str) -> None:
        """PostgreSQL moves its sequences past the highest ids after each migration: never below
        the ids it gave already."""
        async with open_store(database) as store:
            victim_id = await _spend_and_delete_victim(store)
            gone = await create_org(store, "gone")
            await delete(store, Scope("org", gone.id))
        later = Migration("creates table later", ("CREATE TABLE later (x INTEGER)",))
        async with open_store(database, (*MIGRATIONS, later)) as store:
            assert (await create_org(store, "made")).id > gone.id
            await _attacker_inherits_nothing(store, victim_id)


class TestAStoreOfAnEarlierRelease:
    @pytest.mark.parametrize("left", ["usage", "a revoked key"])
    async def test_a_deleted_project_that_rows_still_name_is_not_given_again_after_the_upgrade(
        self, database: Path | str, left: str
    ) -> None:
        async with open_store(database, BEFORE_IDS_WERE_KEPT) as old:
            await operations.create(old, "team", "ml", "default")
            victim = await operations.create(old, "project", "victim", "ml")
            if left == "usage":
                recorder = UsageRecorder()
                recorder.record(0, victim.id, "sim-chat", 200, 10, 5, 0.5, 12.0)
                await recorder.flush(old)
            else:
                _, key = await create_key(old, "victim-key", project_id=victim.id)
                await revoke_key(old, key.prefix)
            await _delete_as_an_earlier_release(old, "victim")
        async with open_store(database) as store:
            attacker = await operations.create(store, "project", "attacker", "ml")
            assert attacker.id > victim.id

    async def test_the_issues_steps_on_the_previous_release_leave_nothing_to_a_project_made_after(
        self, database: Path | str
    ) -> None:
        async with open_store(database, BEFORE_IDS_WERE_KEPT) as old:
            victim_id = await _spend_and_delete_victim(old, earlier_release=True)
        async with open_store(database) as store:
            await _attacker_inherits_nothing(store, victim_id)

    async def test_a_postgresql_sequence_an_earlier_upgrade_moved_back_is_moved_past_what_rows_name(
        self, postgres_url: str
    ) -> None:
        async with open_store(postgres_url, BEFORE_IDS_WERE_KEPT) as old:
            victim_id = await _spend_and_delete_victim(old, earlier_release=True)
            # What each earlier release did after applying a migration: the sequence back to the highest row.
            async with old.transaction() as db:
                await db.execute(
                    "SELECT setval(pg_get_serial_sequence('projects', 'id'),"
                    " (SELECT MAX(id) FROM projects) + 1, false)"
                )
        async with open_store(postgres_url) as store:
            await _attacker_inherits_nothing(store, victim_id)

    async def test_a_removed_key_that_usage_still_names_is_not_given_again_after_the_upgrade(
        self, database: Path | str
    ) -> None:
        async with open_store(database, BEFORE_IDS_WERE_KEPT) as old:
            _, gone = await create_key(old, "gone")
            recorder = UsageRecorder()
            recorder.record(gone.id, 1, "sim-chat", 200, 10, 5, 0.5, 12.0)
            await recorder.flush(old)
            async with old.transaction() as db:
                await db.execute("DELETE FROM api_keys WHERE id = ?", (gone.id,))
        async with open_store(database) as store:
            _, made = await create_key(store, "made")
            assert made.id > gone.id

    async def test_the_previous_release_on_the_upgraded_store_gives_no_id_twice_either(
        self, database: Path | str
    ) -> None:
        """Migration 11 only expands: a server of the release before it (a roll back, a standby not yet
        upgraded) runs on the store, and SQLite keeps its ids for it too."""
        async with open_store(database):
            pass
        async with open_store(database, BEFORE_IDS_WERE_KEPT) as previous:
            victim_id = await _spend_and_delete_victim(previous, earlier_release=True)
            await _attacker_inherits_nothing(previous, victim_id)

    async def test_two_servers_upgrading_one_store_at_once_both_start_and_neither_reuses_an_id(
        self, database: Path | str
    ) -> None:
        async with open_store(database, BEFORE_IDS_WERE_KEPT) as old:
            victim_id = await _spend_and_delete_victim(old, earlier_release=True)

        async def start(name: str) -> int:
            async with open_store(database) as store:
                return (await operations.create(store, "project", name, "ml")).id

        made = await asyncio.gather(start("a"), start("b"))
        assert len(set(made)) == 2 and min(made) > victim_id
        async with open_store(database) as store:
            assert await schema_version(store) == len(MIGRATIONS)


async def _sqlite_schema(store: Store) -> dict[str, str]:
    rows = await store.fetch_all("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
    return {str(row[0]): str(row[1]) for row in rows}


async def test_sqlite_rebuilds_each_table_with_its_rows_constraints_indexes_and_owners(
    tmp_path: Path,
) -> None:
    """The rebuild changes AUTOINCREMENT alone: a key's owner and a session, which the old table's drop
    would have deleted with foreign keys on, are there after it, and the constraints still bind."""
    path = tmp_path / "llmgw.db"
    async with open_store(path, BEFORE_IDS_WERE_KEPT) as old:
        await operations.create(old, "team", "ml", "default")
        project = await operations.create(old, "project", "chat", "ml")
        _, key = await create_key(old, "ci", project_id=project.id, models=["sim-chat"])
        user = await create_user(
            old, "Ann@Example.com", "password one", status="active", project_id=project.id
        )
        await link_key(old, key.id, user.id)
        await create_session(old, user.id, ttl_s=3600)
        tables = (*ID_TABLES, "user_keys", "sessions")
        rows = {t: [tuple(r) for r in await old.fetch_all(f"SELECT * FROM {t} ORDER BY 1")] for t in tables}
        schema = await _sqlite_schema(old)
    # Up to the migration that keeps ids alone: later ones may add columns of their own.
    async with open_store(path, IDS_KEPT) as store:
        assert {
            t: [tuple(r) for r in await store.fetch_all(f"SELECT * FROM {t} ORDER BY 1")] for t in tables
        } == rows
        rebuilt = await _sqlite_schema(store)
        assert rebuilt.pop("sqlite_sequence").startswith("CREATE TABLE sqlite_sequence")
        assert rebuilt.keys() == schema.keys()
        for table in ID_TABLES:
            assert "id INTEGER PRIMARY KEY AUTOINCREMENT" in rebuilt[table]
            same = rebuilt[table].replace(" AUTOINCREMENT", "").replace(f'"{table}"', table)
            assert same == schema[table]
        assert {n: s for n, s in rebuilt.items() if n not in ID_TABLES} == {
            n: s for n, s in schema.items() if n not in ID_TABLES
        }
        assert await store.fetch_value("PRAGMA foreign_keys") == 1
        with pytest.raises(UnknownScope):
            await create_project(store, 999, "nowhere")
        with pytest.raises(ScopeInUse):
            await create_org(store, "default")
        assert (
            await store.fetch_value("SELECT count(*) FROM users WHERE lower(email) = 'ann@example.com'") == 1
        )


class TestCopy:
    async def test_a_copy_either_way_keeps_the_ids_the_source_gave_out(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        source, back = tmp_path / "old.db", tmp_path / "back.db"
        async with open_store(source) as store:
            victim_id = await _spend_and_delete_victim(store)
        await copy_store(f"sqlite://{source}", postgres_url)
        async with open_store(postgres_url) as store:
            gone = await create_org(store, "gone")
            await delete(store, Scope("org", gone.id))
        await copy_store(postgres_url, f"sqlite://{back}")
        async with open_store(back) as store:
            assert (await create_org(store, "made")).id > gone.id
            await _attacker_inherits_nothing(store, victim_id)
