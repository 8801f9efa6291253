"""`llmgw users`: accounts for the pages, from a shell on the control plane.

This is how the first administrator is made (`users create EMAIL --password P`,
then `users promote ID`), and how accounts are managed when nobody can sign in.
"""

from __future__ import annotations

from pathlib import Path

import click

from llmgw.cli.params import Id
from llmgw.cli.store_command import server_config_option, with_config, with_store
from llmgw.config import ServerConfig
from llmgw.store import Store
from llmgw.store.scopes import Hierarchy, Scope, load_hierarchy
from llmgw.store.sessions import end_user_sessions
from llmgw.store.users import (
    User,
    approve_user,
    create_user,
    disable_user,
    generate_password,
    list_users,
    promote_user,
    revoke_user_keys,
)

_config_option = server_config_option("accounts")


def _describe(user: User, hierarchy: Hierarchy) -> str:
    role = "administrator" if user.is_admin else "user"
    where = hierarchy.name(Scope("project", user.project_id)) if user.project_id is not None else "no project"
    return f"user {user.id} {user.email}: {user.status} {role}, {where}"


@click.group()
def users() -> None:
    """Accounts for the web pages (login, profile, /admin)."""


@users.command()
@click.argument("email")
@click.option(
    "--password",
    help="The account's password (at least 8 characters); without it one is generated and printed once.",
)
@_config_option
def create(email: str, password: str | None, config_path: Path) -> None:
    """Create an account for EMAIL, pending until `users approve` puts it in a project or `users promote`."""
    generated = password is None
    chosen = generate_password() if password is None else password
    user = with_store(config_path, lambda store: create_user(store, email, chosen))
    if generated:
        # The password alone on stdout, so that `PW=$(llmgw users create ...)` works.
        click.echo(chosen)
    click.echo(
        f"created user {user.id} {user.email}"
        + ("; its password is shown only this once" if generated else "")
        + f"; it can sign in once approved: `llmgw users approve {user.id} --project P`,"
        f" or `llmgw users promote {user.id}` for an administrator",
        err=True,
    )


@users.command()
@click.argument("user_id", metavar="ID", type=Id())
@click.option(
    "--project", required=True, help="The project (id or name) the account joins, with its team and org."
)
@_config_option
def approve(user_id: int, project: str, config_path: Path) -> None:
    """Let account ID sign in, as a member of PROJECT (and so of its team and organisation)."""

    async def run(store: Store) -> str:
        hierarchy = await load_hierarchy(store)
        user = await approve_user(store, user_id, hierarchy.project_id(project))
        return _describe(user, hierarchy)

    click.echo(with_store(config_path, run))


@users.command()
@click.argument("user_id", metavar="ID", type=Id())
@_config_option
def promote(user_id: int, config_path: Path) -> None:
    """Make account ID an administrator (a pending account becomes active too)."""

    async def run(store: Store) -> str:
        return _describe(await promote_user(store, user_id), await load_hierarchy(store))

    click.echo(with_store(config_path, run))


@users.command()
@click.argument("user_id", metavar="ID", type=Id())
@_config_option
def disable(user_id: int, config_path: Path) -> None:
    """Stop account ID signing in, end its sessions; auth.disabled_user_keys: revoke revokes its keys."""

    async def run(cfg: ServerConfig, store: Store) -> str:
        user = await disable_user(store, user_id)
        await end_user_sessions(store, user_id)
        said = _describe(user, await load_hierarchy(store)) + "; signed out everywhere"
        if cfg.auth.disabled_user_keys == "revoke":
            said += f"; {await revoke_user_keys(store, user_id)} of its keys revoked"
        return said

    click.echo(with_config(config_path, run))


@users.command("list")
@_config_option
def list_(config_path: Path) -> None:
    """List every account: id, email, status, role, source, creation, provider groups, project."""

    async def run(store: Store) -> tuple[list[User], Hierarchy]:
        return await list_users(store), await load_hierarchy(store)

    found, hierarchy = with_store(config_path, run)
    if not found:
        click.echo("no accounts yet; create one with `llmgw users create EMAIL --password P`", err=True)
        return
    width = max(len(u.email) for u in found)
    # Groups joined by commas, each with its spaces kept out, so that the column stays one word.
    groups = {u.id: ",".join(g.replace(" ", "_") for g in u.groups) or "-" for u in found}
    group_width = max(6, *(len(g) for g in groups.values()))
    click.echo(
        f"{'ID':>4} {'EMAIL':<{width}} {'STATUS':<8} {'ROLE':<5} {'SOURCE':<6} {'CREATED (UTC)':<16} "
        f"{'GROUPS':<{group_width}} PROJECT"
    )
    for u in found:
        project = hierarchy.name(Scope("project", u.project_id)) if u.project_id is not None else "-"
        role = "admin" if u.is_admin else "user"
        click.echo(
            f"{u.id:>4} {u.email:<{width}} {u.status:<8} {role:<5} {u.source:<6} "
            f"{u.created_at:%Y-%m-%d %H:%M} {groups[u.id]:<{group_width}} {project}"
        )
