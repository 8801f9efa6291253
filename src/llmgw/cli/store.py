"""`llmgw store`: the control plane's store from a shell on its machine; backing it up."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from llmgw import config
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.cli.store_command import server_config_option
from llmgw.config import ServerConfig
from llmgw.config.database import PostgresUrl, is_postgres_url
from llmgw.errors import ConfigError, LlmgwError, StoreError
from llmgw.store.backup import backup_store
from llmgw.store.transfer import copy_store


@click.group()
def store() -> None:
    """The store: back it up while the server runs; move it to another database."""


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
    required=True,
    metavar="STORE",
    help="The store to copy: sqlite:///PATH/llmgw.db or postgresql://USER@HOST[:PORT]/DATABASE.",
)
@click.option(
    "--to",
    "target",
    required=True,
    metavar="STORE",
    help="The store to copy into, written the same way; created (SQLite) or migrated if need be.",
)
@click.option(
    "--replace", is_flag=True, help="Delete what the target holds first (otherwise it must be empty)."
)
def migrate(source: str, target: str, replace: bool) -> None:
    """Copy every table of one store into another: SQLite to PostgreSQL, or back. Stop the servers first."""
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
