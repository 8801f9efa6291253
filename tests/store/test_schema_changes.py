"""Migrations only expand the schema unless declared as a later release's contract, so that the old and
the new server share the store during a roll of the control planes (docs/operations.md, Upgrading)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw import __version__
from llmgw.store import Store, open_store
from llmgw.store.catalog import list_models, put_model
from llmgw.store.keys import create_key, find_key, hash_key, list_keys, revoke_key
from llmgw.store.migrations import MIGRATIONS, Migration
from llmgw.store.prices import list_prices, set_price
from llmgw.store.quotas import list_budgets, list_limits, set_budget, set_limits
from llmgw.store.schema_changes import Kind, NeverReuseIds, change, kind, problems
from llmgw.store.scopes import Scope, create_project, create_team, load_hierarchy, set_project_models
from llmgw.store.usage import JournalMark, UsageKey, UsageTotals, add_usage, journal_applied, usage_by_day
from llmgw.store.users import approve_user, create_user, get_user_by_email, list_users


class TestWhatAStatementDoes:
    @pytest.mark.parametrize(
        ("statement", "words", "sort"),
        [
            ("CREATE TABLE prices (model TEXT PRIMARY KEY)", "creates table prices", Kind.EXPAND),
            (
                "CREATE UNIQUE INDEX users_by_email ON users (lower(email))",
                "creates index users_by_email on users",
                Kind.EXPAND,
            ),
            ("ALTER TABLE projects ADD COLUMN models TEXT", "adds column projects.models", Kind.EXPAND),
            (
                "ALTER TABLE api_keys ADD COLUMN project_id INTEGER NOT NULL DEFAULT 1",
                "adds column api_keys.project_id",
                Kind.EXPAND,
            ),
            ("INSERT INTO orgs (id, name) VALUES (1, 'default')", "adds rows to orgs", Kind.EXPAND),
            ("UPDATE api_keys SET models = NULL", "fills in rows of api_keys", Kind.EXPAND),
            ("ALTER TABLE api_keys DROP COLUMN models", "drops column api_keys.models", Kind.CONTRACT),
            (
                "ALTER TABLE api_keys RENAME COLUMN models TO allowed",
                "renames column api_keys.models to allowed",
                Kind.CONTRACT,
            ),
            (
                "ALTER TABLE prices RENAME TO model_prices",
                "renames table prices to model_prices",
                Kind.CONTRACT,
            ),
            ("DROP TABLE IF EXISTS usage_journal", "drops table usage_journal", Kind.CONTRACT),
            ("DROP INDEX users_by_email", "drops index users_by_email", Kind.CONTRACT),
            ("DELETE FROM sessions", "deletes rows of sessions", Kind.CONTRACT),
            (
                "ALTER TABLE users ADD COLUMN tz TEXT NOT NULL",
                "adds column users.tz, NOT NULL without a default",
                Kind.CONTRACT,
            ),
            ("VACUUM", "runs `VACUUM`", Kind.CONTRACT),
        ],
    )
    def test_each_statement_is_said_in_words_with_its_kind(
        self, statement: str, words: str, sort: Kind
    ) -> None:
        assert change(statement).does == words
        assert change(statement).kind is sort


def test_keeping_a_tables_ids_is_said_in_words_and_only_expands() -> None:
    """A rebuild on SQLite drops and renames a table, yet the previous release reads and writes it as
    before: the step is not read as the statements it runs."""
    step = NeverReuseIds("projects", ("SELECT MAX(project_id) FROM usage_daily",))
    assert change(step).does.startswith("keeps the ids of projects from being given out again (SQLite:")
    assert change(step).kind is Kind.EXPAND
    assert kind(Migration("keeps ids", (step,))) is Kind.EXPAND


class TestExpandThenContract:
    def test_every_migration_of_this_release_lets_the_previous_release_run_on_the_store(self) -> None:
        assert problems(MIGRATIONS, __version__) == []
        # Every migration so far only expands: none needed declaring.
        assert [kind(m) for m in MIGRATIONS] == [Kind.EXPAND] * len(MIGRATIONS)

    def test_a_dropped_column_not_declared_as_a_contract_is_caught(self) -> None:
        dropped = Migration("drops the models of keys", ("ALTER TABLE api_keys DROP COLUMN models",))
        [problem] = problems((*MIGRATIONS, dropped), "0.5.0")
        assert problem.startswith(f"migration {len(MIGRATIONS) + 1} contracts the schema (drops column")
        assert "unused_since" in problem

    def test_a_contract_is_refused_while_the_previous_release_still_reads_what_it_removes(self) -> None:
        renamed = Migration(
            "renames prices", ("ALTER TABLE prices RENAME TO model_prices",), unused_since="0.5"
        )
        # 0.5 stopped reading `prices`; 0.5 runs beside 0.6 during the roll to 0.6, not beside 0.5's own.
        [problem] = problems((*MIGRATIONS, renamed), "0.5.2")
        assert "runs beside 0.4 during a roll" in problem
        assert problems((*MIGRATIONS, renamed), "0.6.0") == []

    def test_an_expanding_migration_declared_as_a_contract_is_caught(self) -> None:
        declared = Migration("adds a table", ("CREATE TABLE later (x INTEGER)",), unused_since="0.1")
        [problem] = problems((*MIGRATIONS, declared), "0.5.0")
        assert "only expands the schema" in problem


# What a later release might add: a column to every table (one nullable, one with a default) and a table.
def _expansion(tables: list[str]) -> Migration:
    statements = [
        f"ALTER TABLE {table} ADD COLUMN {column}"
        for table in tables
        for column in ("later_note TEXT", "later_count INTEGER NOT NULL DEFAULT 0")
    ]
    statements += ["CREATE TABLE later_things (id INTEGER PRIMARY KEY, name TEXT NOT NULL)"]
    statements += ["CREATE INDEX later_things_by_name ON later_things (name)"]
    return Migration("what a later release adds", statements)


async def _serve_a_round(store: Store) -> None:
    """The store modules' reads and writes, as a server of this release makes them."""
    plaintext, key = await create_key(store, "ci")
    assert [k.name for k in await list_keys(store)] == ["ci"]
    assert (await find_key(store, hash_key(plaintext))) is not None
    assert (await revoke_key(store, key.prefix)) is not None
    team = await create_team(store, 1, "ml")
    project = await create_project(store, team.id, "eval")
    await set_project_models(store, project.id, ["sim-chat"])
    assert project.id in (await load_hierarchy(store)).projects
    user = await create_user(store, "Ada@example.com", "correct horse battery", status="pending")
    await approve_user(store, user.id, project.id)
    assert (await get_user_by_email(store, "ada@example.com")) is not None
    assert [u.email for u in await list_users(store)] == ["Ada@example.com"]
    await set_limits(store, Scope("project", project.id), 60, None)
    await set_budget(store, Scope("project", project.id), 5.0, "day")
    assert len(await list_limits(store)) == 1 and len(await list_budgets(store)) == 1
    await set_price(store, "sim-chat", 0.1, 0.2)
    assert [p.model for p in await list_prices(store)] == ["sim-chat"]
    await put_model(store, "sim-added", "name: sim-added\n", "ctl")
    assert [m.name for m in await list_models(store)] == ["sim-added"]
    row = [(UsageKey("2026-01-01", key.id, project.id, "sim-chat", 200), UsageTotals(1, 3, 4, 0.5, 9.0))]
    await add_usage(store, row, JournalMark("cp1", 7))
    assert await journal_applied(store, "cp1") == 7
    assert [r.requests for r in await usage_by_day(store, Scope("project", project.id))] == [1]


async def test_this_releases_queries_still_work_on_a_store_a_later_expand_only_migration_changed(
    database: Path | str,
) -> None:
    """What the previous release's servers do during a roll, after the first new server migrated."""
    async with open_store(database) as store:
        tables = [str(r[0]) for r in await store.fetch_all(store.dialect.tables) if r[0] != "schema_version"]
    later = _expansion(tables)
    assert kind(later) is Kind.EXPAND
    async with open_store(database, (*MIGRATIONS, later)) as expanded:
        columns = await expanded.fetch_all("SELECT later_note, later_count FROM api_keys")
        assert columns == []
        await _serve_a_round(expanded)
