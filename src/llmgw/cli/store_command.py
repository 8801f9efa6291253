"""Commands that act on the control plane's store from a shell on that machine."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from llmgw import config
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.config import ServerConfig
from llmgw.errors import ConfigError, LlmgwError
from llmgw.store import Store, open_store

T = TypeVar("T")


def server_config_option(what: str) -> Callable[[Any], Any]:
    """`--config`: the server.yaml whose store holds `what`."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=Path("/etc/llmgw/server.yaml"),
        show_default=True,
        help=f"The server's configuration; the {what} live in its store "
        "(`database`, or `state_dir`/llmgw.db).",
    )


def with_store(config_path: Path, action: Callable[[Store], Awaitable[T]]) -> T:
    """Run action on the store that config_path names; a bad config, store or request ends the command."""
    return with_config(config_path, lambda _, store: action(store))


def with_config(config_path: Path, action: Callable[[ServerConfig, Store], Awaitable[T]]) -> T:
    """with_store, for an action that needs the configuration too (its models and prices)."""
    try:
        cfg = config.load(ServerConfig, config_path)

        async def run() -> T:
            async with open_store(cfg.store) as store:
                return await action(cfg, store)

        return asyncio.run(run())
    except ConfigError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except LlmgwError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)
