"""`llmgw orgs`, `llmgw teams`, `llmgw projects`: the hierarchy keys and accounts belong to.

Every key belongs to a project, every project to a team, every team to an
organisation; limits, budgets and usage attach at each level. These act on the
server's store; a running gateway sees a change within a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from llmgw.cli.store_command import server_config_option, with_store
from llmgw.cli.table import echo_table
from llmgw.store import Store
from llmgw.tenancy import operations as tenancy
from llmgw.tenancy import views as tv

_config_option = server_config_option("organisations, teams and projects")


def echo_rows(headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> None:
    """The table, or a sentence on stderr when there is nothing to list."""
    if rows:
        echo_table(headers, rows)
    else:
        click.echo(empty, err=True)


def _row(item: tv.Org | tv.Team | tv.Project) -> list[str]:
    if isinstance(item, tv.Org):
        return [str(item.id), item.name]
    if isinstance(item, tv.Team):
        return [str(item.id), item.name, item.org]
    models = "any" if item.models is None else (", ".join(item.models) or "none")
    return [str(item.id), item.name, item.team, item.org, models]


_HEADERS = {
    "org": ["ID", "NAME"],
    "team": ["ID", "NAME", "ORG"],
    "project": ["ID", "NAME", "TEAM", "ORG", "MODELS"],
}


def _level_group(kind: tenancy.Level, plural: str, parent: str | None) -> click.Group:
    """The create, rename, list and delete commands of one level."""
    what = {"org": "organisation", "team": "team", "project": "project"}[kind]

    @click.group(name=plural, help=f"The {what}s: create, rename, list, delete.")
    def group() -> None:
        pass

    def create(name: str, config_path: Path, parent_text: str = "") -> None:
        item = with_store(config_path, lambda store: tenancy.create(store, kind, name, parent_text))
        click.echo(f"created {what} {item.id} '{item.name}'" + _under(item))

    if parent is None:

        @group.command("create")
        @click.argument("name")
        @_config_option
        def create_org(name: str, config_path: Path) -> None:
            """Create an organisation called NAME (names are unique)."""
            create(name, config_path)

    else:

        @group.command("create")
        @click.argument("name")
        @click.option(
            f"--{parent}",
            "parent_text",
            required=True,
            help=f"The {'organisation' if parent == 'org' else parent} it goes in, by id or name.",
        )
        @_config_option
        def create_child(name: str, parent_text: str, config_path: Path) -> None:
            """Create NAME (unique within what it goes in)."""
            create(name, config_path, parent_text)

        create_child.help = f"Create a {what} called NAME, unique within its {parent}."

    @group.command("rename")
    @click.argument(kind.upper())
    @click.argument("new_name", metavar="NEW_NAME")
    @_config_option
    def rename(new_name: str, config_path: Path, **named: str) -> None:
        item = with_store(config_path, lambda store: tenancy.rename(store, kind, named[kind], new_name))
        click.echo(f"{what} {item.id} is now called '{item.name}'")

    rename.help = f"Give {kind.upper()} (id or name) a new name; its keys, members and quotas stay."

    @group.command("list")
    @_config_option
    def list_(config_path: Path, **filters: str | None) -> None:
        chosen = filters.get(parent) if parent else None
        items = with_store(config_path, lambda store: tenancy.list_level(store, kind, chosen))
        echo_rows(_HEADERS[kind], [_row(i) for i in items], f"no {what}s")

    list_.help = f"Every {what}" + (f", or those of one {parent} with --{parent}." if parent else ".")
    if parent is not None:
        click.option(f"--{parent}", help=f"Only the {what}s of this {parent} (id or name).")(list_)

    @group.command("delete")
    @click.argument(kind.upper())
    @_config_option
    def delete(config_path: Path, **named: str) -> None:
        done = with_store(config_path, lambda store: tenancy.delete(store, kind, named[kind]))
        click.echo(f"deleted {done.name}")

    delete.help = (
        f"Delete {kind.upper()} (id or name), with its limits and budget; refused, saying what is "
        + {"org": "left, while it has teams.", "team": "left, while it has projects."}.get(
            kind, "left, while it has live keys or members."
        )
    )
    return group


def _under(item: tv.Org | tv.Team | tv.Project) -> str:
    if isinstance(item, tv.Team):
        return f" in org '{item.org}'"
    if isinstance(item, tv.Project):
        return f" in team '{item.team}' (org '{item.org}')"
    return ""


orgs = _level_group("org", "orgs", None)
teams = _level_group("team", "teams", "org")
projects = _level_group("project", "projects", "team")
projects.help = "The projects: create, rename, list, delete, members, models."


@projects.command("models")
@click.argument("project")
@click.option("--model", "models", multiple=True, help="A model the project may call; repeat for several.")
@click.option("--any", "any_model", is_flag=True, help="Let the project call any model again.")
@_config_option
def project_models(project: str, models: tuple[str, ...], any_model: bool, config_path: Path) -> None:
    """Limit PROJECT's keys to the --model models (--any: every model); each key's own list applies too."""
    if any_model == bool(models):
        raise click.UsageError("give the models with --model (repeat it), or --any for every model")
    chosen = None if any_model else models
    item = with_store(config_path, lambda store: tenancy.set_models(store, project, chosen))
    allowed = "any model" if item.models is None else ", ".join(item.models)
    click.echo(f"project '{item.name}' may call {allowed}; a running gateway applies it within a second")


@projects.group("members")
def members() -> None:
    """The accounts in a project: their keys count against it."""


@members.command("add")
@click.argument("project")
@click.argument("user")
@_config_option
def add_member(project: str, user: str, config_path: Path) -> None:
    """Put account USER (id or email) in PROJECT, out of any other; a pending account is approved."""

    async def run(store: Store) -> tuple[tv.Member, str]:
        member = await tenancy.add_member(store, project, user)
        where = await tenancy.list_level(store, "project")
        name = next(p.name for p in where if p.id == member.project_id)
        return member, name

    member, name = with_store(config_path, run)
    click.echo(f"{member.email} is a member of project '{name}' and can create keys for it on their profile")


@members.command("remove")
@click.argument("project")
@click.argument("user")
@_config_option
def remove_member(project: str, user: str, config_path: Path) -> None:
    """Take account USER (id or email) out of PROJECT; it still signs in, and can create no keys."""
    member = with_store(config_path, lambda store: tenancy.remove_member(store, project, user))
    click.echo(f"{member.email} is in no project now; the keys it made stay until revoked")


@members.command("list")
@click.argument("project")
@_config_option
def list_members(project: str, config_path: Path) -> None:
    """The accounts in PROJECT."""
    found = with_store(config_path, lambda store: tenancy.members(store, project))
    rows = [[str(m.id), m.email, m.status, "administrator" if m.admin else "user"] for m in found]
    echo_rows(["ID", "EMAIL", "STATUS", "ROLE"], rows, "no members")
