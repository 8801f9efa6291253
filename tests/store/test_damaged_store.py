"""A store that cannot be used stops the real server with one sentence and exit 1; a backup restores it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import config
from llmgw.cli.exit import EXIT_ERROR
from llmgw.roles.dev import prepare_dev
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server_yaml(tmp_path: Path) -> Path:
    """A server.yaml with its own certificates and store, every listener on a free port."""
    setup = prepare_dev(tmp_path / "dev", ("server",))
    assert setup.server is not None
    path = tmp_path / "server.yaml"
    free = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "agent_listen": "127.0.0.1:0"}
    path.write_text(config.dump(config.evolve(setup.server, **free)))
    return path


def _database(server_yaml: Path) -> Path:
    return config.load(config.ServerConfig, server_yaml).database_path


def _llmgw(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@contextlib.contextmanager
def _running(server_yaml: Path) -> Iterator[list[str]]:
    """The server role as a process, until the block ends; yields its output so far."""
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "--role=server", "--config", str(server_yaml)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        output.extend(line.rstrip("\n") for line in process.stdout)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        wait_until(
            lambda: any("server ready" in line for line in output) or process.poll() is not None,
            60,
            "the server to be ready",
        )
        assert process.poll() is None, "\n".join(output)
        yield output
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


def _start_refused(server_yaml: Path) -> str:
    """Start the server on a store it cannot use; the one line it says (after checking exit 1)."""
    result = _llmgw("--role=server", "--config", str(server_yaml))
    assert result.returncode == EXIT_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("llmgw: ")
    return last


def _filled(server_yaml: Path) -> Path:
    """The store, with keys in it (the first command to open it creates it, as the server would)."""
    for i in range(3):
        created = _llmgw("keys", "create", f"key-{i}", "--config", str(server_yaml))
        assert created.returncode == 0, created.stderr
    return _database(server_yaml)


def _damage(database: Path, table: str) -> None:
    """Overwrite the pages of table's b-tree, leaving the file's header whole: what a bad disk does."""
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        (size,) = db.execute("PRAGMA page_size").fetchone()
    db.close()
    data = bytearray(database.read_bytes())
    start = (root - 1) * size
    data[start : start + size] = bytes((i * 7 + 3) % 256 for i in range(size))
    database.write_bytes(bytes(data))


class TestAStoreThatCannotBeUsed:
    @pytest.mark.parametrize("table", ["api_keys", "usage_daily", "catalog_models"])
    def test_damaged_pages_behind_a_valid_header_are_one_sentence_saying_to_restore_or_recover(
        self, server_yaml: Path, table: str
    ) -> None:
        database = _filled(server_yaml)
        _damage(database, table)
        said = _start_refused(server_yaml)
        assert said.startswith(f"llmgw: the store {database} is damaged (database disk image is malformed")
        assert "restore it from a backup (docs/operations.md)" in said
        assert f"`sqlite3 {database} .recover | sqlite3 {database}.recovered`" in said

    def test_a_file_that_is_not_a_database_is_damaged_too(self, server_yaml: Path) -> None:
        database = _database(server_yaml)
        database.parent.mkdir(parents=True, exist_ok=True)
        database.write_bytes(os.urandom(64 * 1024))
        assert _start_refused(server_yaml).startswith(
            f"llmgw: the store {database} is damaged (file is not a database)"
        )

    def test_a_store_of_a_later_release_says_to_run_it_or_restore_a_backup(self, server_yaml: Path) -> None:
        database = _filled(server_yaml)
        with sqlite3.connect(database) as db:
            db.execute("INSERT INTO schema_version (version, applied_at) VALUES (999, 'later')")
        db.close()
        said = _start_refused(server_yaml)
        assert said.startswith(f"llmgw: the store {database} is at schema version 999, newer than this llmgw")
        assert said.endswith("run that release (or later), or restore a backup made before the upgrade")

    def test_a_store_on_a_read_only_file_system_says_it_cannot_be_written(self, server_yaml: Path) -> None:
        database = _filled(server_yaml)
        state = database.parent
        if os.geteuid() != 0:
            state.chmod(0o555)
            database.chmod(0o444)
            try:
                said = _start_refused(server_yaml)
            finally:
                state.chmod(0o755)
                database.chmod(0o644)
        else:
            # Root writes through file modes; a read-only bind mount, in a mount namespace of the
            # server's own, is what root cannot write through.
            script = (
                f"mount --bind {state} {state} && mount -o remount,bind,ro {state} && "
                f"exec {sys.executable} -m llmgw --role=server --config {server_yaml}"
            )
            result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True)
            if "Operation not permitted" in result.stderr or "unshare failed" in result.stderr:
                pytest.fail(
                    f"root cannot make a read-only mount here: {result.stderr.strip()}", pytrace=False
                )
            assert result.returncode == EXIT_ERROR, result.stderr
            assert "Traceback" not in result.stderr
            said = result.stderr.strip().splitlines()[-1]
        assert said.startswith(f"llmgw: the store {database} cannot be ")
        assert "give the user llmgw runs as write access to the file and its directory" in said

    def test_a_second_server_on_the_same_store_is_refused_and_the_first_serves_on(
        self, server_yaml: Path
    ) -> None:
        database = _database(server_yaml)
        with _running(server_yaml) as first:
            said = _start_refused(server_yaml)
            assert said == (
                f"llmgw: the store {database} is in use by another llmgw server on this machine: stop that "
                "server, or give this one its own `database` (or `state_dir`) in server.yaml"
            )
            # The commands of the same machine still use it while the server runs.
            assert _llmgw("keys", "create", "meanwhile", "--config", str(server_yaml)).returncode == 0
            assert not any("Traceback" in line for line in first)


class TestBackupAndRestore:
    def test_a_backup_taken_while_the_server_runs_restores_a_damaged_store(
        self, server_yaml: Path, tmp_path: Path
    ) -> None:
        database = _database(server_yaml)
        backup = tmp_path / "backups" / "llmgw-backup.db"
        backup.parent.mkdir()
        with _running(server_yaml):
            created = _llmgw("keys", "create", "kept", "--config", str(server_yaml))
            assert created.returncode == 0, created.stderr
            taken = _llmgw("store", "backup", str(backup), "--config", str(server_yaml))
            assert taken.returncode == 0, taken.stderr
            assert taken.stdout.startswith(f"backed up {database} to {backup} (")
            # Written after the backup: what restoring it loses.
            assert _llmgw("keys", "create", "lost", "--config", str(server_yaml)).returncode == 0
        _damage(database, "api_keys")
        assert "is damaged" in _start_refused(server_yaml)

        # The restore docs/operations.md describes: the damaged file and its -wal and -shm aside, the
        # backup in its place.
        for part in (
            database,
            database.with_name(f"{database.name}-wal"),
            database.with_name(f"{database.name}-shm"),
        ):
            if part.exists():
                part.rename(part.with_name(f"{part.name}.damaged"))
        shutil.copy(backup, database)

        with _running(server_yaml):
            listed = _llmgw("keys", "list", "--config", str(server_yaml))
        assert listed.returncode == 0, listed.stderr
        assert "kept" in listed.stdout and "lost" not in listed.stdout

    def test_a_backup_never_overwrites_a_file(self, server_yaml: Path, tmp_path: Path) -> None:
        _filled(server_yaml)
        existing = tmp_path / "precious.db"
        existing.write_text("not a backup")
        result = _llmgw("store", "backup", str(existing), "--config", str(server_yaml))
        assert result.returncode == EXIT_ERROR
        assert result.stderr.strip() == (
            f"llmgw: {existing} already exists; a backup never overwrites a file, so name a new one"
        )
        assert existing.read_text() == "not a backup"

    def test_backing_up_a_store_that_is_not_there_says_where_it_looked(
        self, server_yaml: Path, tmp_path: Path
    ) -> None:
        result = _llmgw("store", "backup", str(tmp_path / "b.db"), "--config", str(server_yaml))
        assert result.returncode == EXIT_ERROR
        assert result.stderr.strip() == (
            f"llmgw: there is no store at {_database(server_yaml)}; "
            "check `database` and `state_dir` in server.yaml"
        )
