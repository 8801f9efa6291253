"""`llmgw keys`: create, list and revoke API keys, from a shell on the control plane."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import click

from llmgw import config
from llmgw.cli.store_command import server_config_option, with_store
from llmgw.config import ServerConfig
from llmgw.errors import LlmgwError
from llmgw.names import key_name_problem
from llmgw.store import Store
from llmgw.store.keys import KeyRecord, create_key, list_keys, revoke_key
from llmgw.store.scopes import DEFAULT_PROJECT_ID, Scope, load_hierarchy

_config_option = server_config_option("keys")


@click.group()
def keys() -> None:
    """API keys for the gateway's /v1 routes."""


@keys.command()
@click.argument("name")
@click.option(
    "--project",
    help="The project (id or name) whose limits and budget the key's requests count against "
    "[default: the default project].",
)
@click.option(
    "--expires",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"]),
    help="When the key stops working, in UTC: YYYY-MM-DD (its first minute) or YYYY-MM-DDTHH:MM.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="A model the key may call; repeat for several. Without it the key may call any model.",
)
@_config_option
def create(
    name: str, project: str | None, expires: datetime | None, models: tuple[str, ...], config_path: Path
) -> None:
    """Create a key called NAME and print it; it is shown this once and never again."""
    problem = key_name_problem(name)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="NAME")
    expires_at = expires.replace(tzinfo=UTC) if expires is not None else None
    if expires_at is not None and expires_at <= datetime.now(UTC):
        raise click.BadParameter(
            f"{expires_at:%Y-%m-%d %H:%M} UTC has already passed", param_hint="'--expires'"
        )

    async def create_in(store: Store) -> tuple[str, KeyRecord, str]:
        if models:
            # A key for a model the catalog lacks (a typo, most often) would be refused every call.
            # Here, not at the top: `llmgw keys --help` must not load the gateway's aiohttp.
            from llmgw.catalog import Catalog

            cfg = await asyncio.to_thread(config.load, ServerConfig, config_path)
            known = set((await Catalog.open(cfg, store)).names())
            unknown = [m for m in models if m not in known]
            if unknown:
                raise LlmgwError(
                    f"the catalog has no model {', '.join(unknown)}; it has "
                    f"{', '.join(sorted(known)) or 'none'} (`llmgw ctl models` lists them)"
                )
        hierarchy = await load_hierarchy(store)
        project_id = hierarchy.project_id(project) if project is not None else DEFAULT_PROJECT_ID
        plaintext, record = await create_key(
            store, name, project_id=project_id, expires_at=expires_at, models=models or None
        )
        return plaintext, record, hierarchy.name(Scope("project", project_id))

    plaintext, record, where = with_store(config_path, create_in)
    # The key alone on stdout, so that `KEY=$(llmgw keys create ci)` works.
    click.echo(plaintext)
    until = f", until {record.expires_at:%Y-%m-%d %H:%M} UTC" if record.expires_at else ""
    only = f", for {', '.join(record.models)} only" if record.models else ""
    click.echo(
        f"created key '{record.name}' ({record.prefix}…) in {where}{until}{only}; "
        "it is shown only this once, only its hash is kept",
        err=True,
    )


@keys.command("list")
@_config_option
def list_(config_path: Path) -> None:
    """List every key: prefix, name, when it was created, whether it was revoked."""
    records = with_store(config_path, list_keys)
    if not records:
        click.echo("no keys yet; create one with `llmgw keys create NAME`", err=True)
        return
    width = max(len(r.name) for r in records)
    click.echo(f"{'PREFIX':<18} {'NAME':<{width}} {'CREATED (UTC)':<17} STATUS")
    now = datetime.now(UTC)
    for r in records:
        status = f"revoked {r.revoked_at:%Y-%m-%d %H:%M}" if r.revoked_at else "active"
        if not r.revoked_at and r.expires_at is not None:
            status = f"{'expired' if r.expires_at <= now else 'expires'} {r.expires_at:%Y-%m-%d %H:%M}"
        click.echo(f"{r.prefix + '…':<18} {r.name:<{width}} {r.created_at:%Y-%m-%d %H:%M} {status}")


@keys.command()
@click.argument("prefix")
@_config_option
def revoke(prefix: str, config_path: Path) -> None:
    """Revoke the key whose listing starts with PREFIX (as `llmgw keys list` shows it), or the whole key."""
    # Pasted from `llmgw keys list`, the prefix may carry its ellipsis.
    prefix = prefix.rstrip("…")
    record = with_store(config_path, lambda store: revoke_key(store, prefix))
    if record is None:
        raise click.ClickException(f"no key has the prefix '{prefix}'; `llmgw keys list` shows them")
    assert record.revoked_at is not None
    click.echo(
        f"key '{record.name}' ({record.prefix}…) is revoked since {record.revoked_at:%Y-%m-%d %H:%M} UTC; "
        "a running gateway refuses it within a second"
    )
