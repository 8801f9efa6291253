"""`llmgw keys`: create, list and revoke API keys, from a shell on the control plane."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click

from llmgw import config
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.config import ServerConfig
from llmgw.errors import ConfigError, LlmgwError
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key, list_keys, revoke_key

T = TypeVar("T")

_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("/etc/llmgw/server.yaml"),
    show_default=True,
    help="The server's configuration; the keys live in its store (`database`, or `state_dir`/llmgw.db).",
)


def _with_store(config_path: Path, action: Callable[[Store], Awaitable[T]]) -> T:
    """Run action on the store that config_path names; a bad config or store ends the command."""
    try:
        database = config.load(ServerConfig, config_path).database_path

        async def run() -> T:
            async with open_store(database) as store:
                return await action(store)

        return asyncio.run(run())
    except ConfigError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except LlmgwError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)


@click.group()
def keys() -> None:
    """API keys for the gateway's /v1 routes."""


@keys.command()
@click.argument("name")
@_config_option
def create(name: str, config_path: Path) -> None:
    """Create a key called NAME and print it; it is shown this once and never again."""
    if not name.strip():
        raise click.BadParameter("a key needs a name, so that a person can tell what it is for")
    plaintext, record = _with_store(config_path, lambda store: create_key(store, name))
    # The key alone on stdout, so that `KEY=$(llmgw keys create ci)` works.
    click.echo(plaintext)
    click.echo(
        f"created key '{record.name}' ({record.prefix}…); it is shown only this once, only its hash is kept",
        err=True,
    )


@keys.command("list")
@_config_option
def list_(config_path: Path) -> None:
    """List every key: prefix, name, when it was created, whether it was revoked."""
    records = _with_store(config_path, list_keys)
    if not records:
        click.echo("no keys yet; create one with `llmgw keys create NAME`", err=True)
        return
    width = max(len(r.name) for r in records)
    click.echo(f"{'PREFIX':<18} {'NAME':<{width}} {'CREATED (UTC)':<17} STATUS")
    for r in records:
        status = f"revoked {r.revoked_at:%Y-%m-%d %H:%M}" if r.revoked_at else "active"
        click.echo(f"{r.prefix + '…':<18} {r.name:<{width}} {r.created_at:%Y-%m-%d %H:%M} {status}")


@keys.command()
@click.argument("prefix")
@_config_option
def revoke(prefix: str, config_path: Path) -> None:
    """Revoke the key whose listing starts with PREFIX (as `llmgw keys list` shows it), or the whole key."""
    # Pasted from `llmgw keys list`, the prefix may carry its ellipsis.
    prefix = prefix.rstrip("…")
    record = _with_store(config_path, lambda store: revoke_key(store, prefix))
    if record is None:
        raise click.ClickException(f"no key has the prefix '{prefix}'; `llmgw keys list` shows them")
    assert record.revoked_at is not None
    click.echo(
        f"key '{record.name}' ({record.prefix}…) is revoked since {record.revoked_at:%Y-%m-%d %H:%M} UTC; "
        "a running gateway refuses it within a second"
    )
