"""`llmgw store`: the control plane's store from a shell on its machine; backing it up."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from llmgw import config
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR, EXIT_PENDING
from llmgw.cli.migration_report import migration_lines
from llmgw.cli.store_command import server_config_option
from llmgw.config import ServerConfig
from llmgw.config.database import PostgresUrl, is_postgres_url
from llmgw.errors import ConfigError, LlmgwError, StoreError
from llmgw.store import open_store
from llmgw.store.backup import backup_store
from llmgw.store.pending import pending_migrations
from llmgw.store.transfer import copy_store


@click.group()
def store() -> None:
    """The store: back it up while the server runs; bring its schema up to date; move it elsewhere."""


@store.command()
@click.argument("out", type=click.Path(path_type=Path, dir_okay=False))
@server_config_option("accounts, keys, usage and added models")
def backup(out: Path, config_path: Path) -> None:
    """Write a consistent copy of the store to OUT (a new file), while the server runs or not."""
    try:
        cfg = config.load(ServerConfig, config_path)
        if is_postgres_url(cfg.database):
            # VACUUM INTO is SQLite's; PostgreSQL's own tool takes a consistent copy while servers run.
            raise StoreError(
                f"the store is the PostgreSQL database {PostgresUrl.parse(cfg.database)}: back it up with "
                f"PostgreSQL's own tool, `pg_dump --format=custom --file={out} DATABASE_URL` "
                "(docs/operations.md)"
            )
        database = cfg.database_path
        size = backup_store(database, out)
    except ConfigError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except LlmgwError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(f"backed up {database} to {out} ({size:,} bytes)")


@store.command()
@click.option(
    "--from",
    "source",
    metavar="STORE",
    help="Copy this store: sqlite:///PATH/llmgw.db or postgresql://USER@HOST[:PORT]/DATABASE.",
)
@click.option(
    "--to",
    "target",
    metavar="STORE",
    help="The store to copy into, written the same way; created (SQLite) or migrated if need be.",
)
@click.option(
    "--replace", is_flag=True, help="Delete what the target holds first (otherwise it must be empty)."
)
@click.option(
    "--check",
    is_flag=True,
    help="Only say which migrations the store lacks and what each does; change nothing. "
    f"Exits {EXIT_PENDING} when some are pending, 0 when none.",
)
@server_config_option("accounts, keys, usage and added models")
def migrate(source: str | None, target: str | None, replace: bool, check: bool, config_path: Path) -> None:
    """Bring the store's schema up to date (--check: say what that would do), or, with --from and
    --to, copy every table of one store into another: SQLite to PostgreSQL, or back."""
    if (source is None) != (target is None):
        raise click.UsageError("--from and --to go together: the store to copy and where to")
    if source is not None and target is not None:
        if check:
            raise click.UsageError("--check reads the store of --config; it does not go with --from")
        _copy(source, target, replace)
        return
    if replace:
        raise click.UsageError("--replace goes with --from and --to")
    database = _configured_store(config_path)
    try:
        pending = asyncio.run(pending_migrations(database))
        if pending.contracting_after:
            numbers = ", ".join(str(n) for n in pending.contracting_after)
            raise StoreError(
                f"the store {pending.where} is at schema version {pending.version}, newer than this "
                f"llmgw knows ({pending.known}), and migration {numbers} of a later release contracts "
                "it: run that release (or later)"
            )
        if not check and pending.migrations:
            asyncio.run(_apply(database))
    except LlmgwError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    for line in migration_lines(pending, applied=not check):
        click.echo(line)
    if check and pending.migrations:
        sys.exit(EXIT_PENDING)


def _configured_store(config_path: Path) -> Path | str:
    try:
        return config.load(ServerConfig, config_path).store
    except ConfigError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


async def _apply(database: Path | str) -> None:
    async with open_store(database):
        pass


def _copy(source: str, target: str, replace: bool) -> None:
    try:
        copied = asyncio.run(copy_store(source, target, replace=replace))
    except LlmgwError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    width = max(len(table) for table in copied)
    for table, rows in copied.items():
        click.echo(f"{table:<{width}}  {rows:>9,} rows")
    click.echo(
        f"copied {sum(copied.values()):,} rows in {len(copied)} tables; point `database` at the new store"
    )
