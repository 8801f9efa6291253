"""`llmgw store migrate [--check]`: what the store lacks of the schema, said before anything changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.exit import EXIT_ERROR, EXIT_PENDING, EXIT_USAGE
from llmgw.cli.migration_report import migration_lines
from llmgw.cli.store import store
from llmgw.config.database import PostgresUrl
from llmgw.store import open_store
from llmgw.store.migrations import MIGRATIONS, Migration
from llmgw.store.pending import Pending
from llmgw.store.schema_changes import change

LATEST = len(MIGRATIONS)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "sqlite":
        return tmp_path / "state" / "llmgw.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def config(tmp_path: Path, database: Path | str) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(f"database: {database}\n")
    return path


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(store, ["migrate", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _open_at(database: Path | str, migrations: tuple[Migration, ...]) -> None:
    async def opened() -> None:
        async with open_store(database, migrations):
            pass

    asyncio.run(opened())


class TestCheck:
    def test_a_store_one_migration_behind_is_told_what_it_lacks_and_is_left_as_it_was(
        self, config: Path, database: Path | str
    ) -> None:
        _open_at(database, tuple(MIGRATIONS[:-1]))
        code, out, _ = _run("--check", "--config", str(config))
        assert code == EXIT_PENDING
        assert f"is at schema version {LATEST - 1}: 1 migration pending, to {LATEST}" in out
        assert f"  {LATEST}  expand    {MIGRATIONS[-1].does}" in out
        assert f"- {change(MIGRATIONS[-1].statements[-1]).does}" in out
        assert "safe to apply while the previous release still runs" in out
        # Nothing was applied: the check again says the same.
        assert _run("--check", "--config", str(config))[0] == EXIT_PENDING

    def test_a_store_up_to_date_has_nothing_pending_and_exits_zero(
        self, config: Path, database: Path | str
    ) -> None:
        _open_at(database, tuple(MIGRATIONS))
        code, out, _ = _run("--check", "--config", str(config))
        assert (code, out) == (
            0,
            f"the store {_where(database)} is at schema version {LATEST}: nothing to apply\n",
        )

    def test_a_contracting_migration_is_said_to_need_the_older_servers_stopped(self) -> None:
        dropped = Migration("retires prices", ("DROP TABLE prices",), unused_since="0.9")
        pending = Pending("/var/lib/llmgw/llmgw.db", LATEST, LATEST + 1, [(LATEST + 1, dropped)])
        out = "\n".join(migration_lines(pending, applied=False))
        assert f"  {LATEST + 1}  contract  retires prices" in out
        assert "- drops table prices" in out
        assert f"contracting: {LATEST + 1} (nothing reads what it removes since 0.9)" in out


def _where(database: Path | str) -> str:
    """The store as messages name it: the file, or the address without its password."""
    return str(PostgresUrl.parse(database)) if isinstance(database, str) else str(database)


class TestApply:
    def test_migrate_applies_what_the_check_listed_and_then_nothing(self, config: Path) -> None:
        code, out, _ = _run("--config", str(config))
        assert code == 0
        assert f"applied {LATEST} migrations to the store" in out and f"schema version 0 -> {LATEST}" in out
        assert _run("--check", "--config", str(config))[0] == 0
        assert _run("--config", str(config))[1].endswith("nothing to apply\n")


def test_a_new_sqlite_store_is_checked_without_being_created(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    code, out, _ = _run("--check", "--config", str(config))
    assert code == EXIT_PENDING
    assert f"has no schema yet: {LATEST} migrations to apply" in out
    assert not (tmp_path / "state" / "llmgw.db").exists()


def test_a_store_a_later_release_contracted_is_an_error_with_a_sentence(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    dropped = Migration("retires prices", ("DROP TABLE prices",), unused_since="0.1")
    _open_at(tmp_path / "state" / "llmgw.db", (*MIGRATIONS, dropped))
    code, _, err = _run("--check", "--config", str(config))
    assert code == EXIT_ERROR
    assert f"is at schema version {LATEST + 1}, newer than this llmgw knows ({LATEST})" in err
    assert f"migration {LATEST + 1} of a later release contracts it" in err


def test_a_store_a_later_release_only_expanded_has_nothing_pending(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    later = Migration("creates table later", ("CREATE TABLE later (x INTEGER)",))
    _open_at(tmp_path / "state" / "llmgw.db", (*MIGRATIONS, later))
    code, out, _ = _run("--check", "--config", str(config))
    assert code == 0
    assert "every later migration only expands it, so this release runs on it" in out


@pytest.mark.parametrize(
    "args",
    [
        ["--from", "sqlite:///a.db"],
        ["--to", "sqlite:///b.db"],
        ["--check", "--from", "sqlite:///a.db", "--to", "sqlite:///b.db"],
        ["--replace"],
    ],
)
def test_copy_flags_are_refused_where_they_do_not_belong(args: list[str], tmp_path: Path) -> None:
    assert _run(*args, "--config", str(tmp_path / "server.yaml"))[0] == EXIT_USAGE
