"""Organisations, teams and projects: who a key's requests are counted against.

Every key belongs to a project, every project to a team, every team to an
organisation. A `default` of each exists from the first start (migration 2),
so a fresh install has somewhere to put its first key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

import attrs

from llmgw import strictjson
from llmgw.errors import LlmgwError
from llmgw.names import id_number, scope_name_problem
from llmgw.store.base import Duplicate, IntegrityError, MissingReference, Queries, Store

ScopeKind = Literal["org", "team", "project", "key"]
SCOPE_KINDS: tuple[ScopeKind, ...] = ("key", "project", "team", "org")

DEFAULT_ORG_ID = 1
DEFAULT_TEAM_ID = 1
DEFAULT_PROJECT_ID = 1


class ScopeError(LlmgwError):
    """A scope that cannot be created or found, in a sentence."""


class UnknownScope(ScopeError):
    """What was named does not exist (the admin API's 404)."""


class ScopeInUse(ScopeError):
    """The name is taken, or something still belongs to it (the admin API's 409)."""


class AmbiguousScope(ScopeError):
    """Several have the name given: the id says which (the admin API's 409, as the state, not the
    request, is what is wrong: the same request named one team before a second was given its name)."""


@attrs.frozen(cache_hash=True)
class Scope:
    """Something limits, budgets and usage attach to: a key, a project, a team or an org."""

    # cache_hash: admission hashes each scope of a chain several times per request.
    kind: ScopeKind
    id: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"

    @classmethod
    def parse(cls, text: str) -> Scope:
        """ "project:3" -> Scope("project", 3)."""
        kind, _, number = text.partition(":")
        scope_id = id_number(number)
        if kind not in SCOPE_KINDS or scope_id is None:
            raise ScopeError(f"'{text}' is not a scope: write KIND:ID, KIND one of {', '.join(SCOPE_KINDS)}")
        return cls(kind, scope_id)


@attrs.frozen
class Org:
    id: int
    name: str


@attrs.frozen
class Team:
    id: int
    org_id: int
    name: str


@attrs.frozen
class Project:
    id: int
    team_id: int
    name: str
    # None: every model; a tuple: only these, for every key of the project.
    models: tuple[str, ...] | None = None


@attrs.frozen
class DeletedProject:
    """A project deleted since, as it was: its usage stays filed under its id, and what it spent still
    counts toward the budgets of the team and organisation it was in (migration 12)."""

    id: int
    team_id: int
    org_id: int
    name: str

    @property
    def scopes(self) -> tuple[Scope, Scope, Scope]:
        """The scopes its spending counts toward, as a live project's chain does."""
        return (Scope("project", self.id), Scope("team", self.team_id), Scope("org", self.org_id))


@attrs.frozen
class Chain:
    """A project with the team and org above it."""

    project: Project
    team: Team
    org: Org

    @property
    def scopes(self) -> tuple[Scope, Scope, Scope]:
        return (Scope("project", self.project.id), Scope("team", self.team.id), Scope("org", self.org.id))


@attrs.frozen
class Hierarchy:
    """The whole tree, loaded at once, so the gateway resolves a key's chain without the database."""

    orgs: Mapping[int, Org]
    teams: Mapping[int, Team]
    projects: Mapping[int, Project]

    def chain(self, project_id: int) -> Chain:
        project = self.projects[project_id]
        team = self.teams[project.team_id]
        return Chain(project=project, team=team, org=self.orgs[team.org_id])

    def name(self, scope: Scope) -> str:
        """How a person is told about a scope: "project 'web' (team 'core', org 'acme')"."""
        if scope.kind == "org" and scope.id in self.orgs:
            return f"org '{self.orgs[scope.id].name}'"
        if scope.kind == "team" and scope.id in self.teams:
            team = self.teams[scope.id]
            return f"team '{team.name}' (org '{self.orgs[team.org_id].name}')"
        if scope.kind == "project" and scope.id in self.projects:
            chain = self.chain(scope.id)
            return f"project '{chain.project.name}' (team '{chain.team.name}', org '{chain.org.name}')"
        return f"{scope.kind} {scope.id}"

    def org_id(self, text: str) -> int:
        """The organisation a person named by id or by name."""
        return _resolve("organisation", text, {o.id: o.name for o in self.orgs.values()}, self.name, "org")

    def team_id(self, text: str) -> int:
        """The team a person named by id or by name; a name several organisations use must be given by id."""
        return _resolve("team", text, {t.id: t.name for t in self.teams.values()}, self.name, "team")

    def project_id(self, text: str) -> int:
        """The project a person named by id or by name; a name several teams use must be given by id."""
        return _resolve("project", text, {p.id: p.name for p in self.projects.values()}, self.name, "project")


def _resolve(
    what: str,
    text: str,
    names: Mapping[int, str],
    describe: Callable[[Scope], str],
    kind: Literal["org", "team", "project"],
) -> int:
    """The id of the one item text names, by id or by name, or a ScopeError listing the choices."""
    as_id = id_number(text)
    if as_id is not None and as_id in names:
        return as_id
    named = [item_id for item_id, name in names.items() if name == text]
    if len(named) == 1:
        return named[0]
    if named:
        choices = "; ".join(f"{item_id}: {describe(Scope(kind, item_id))}" for item_id in named)
        raise AmbiguousScope(f"several {what}s are called '{text}'; give the id of one: {choices}")
    known = ", ".join(f"{item_id} ({name})" for item_id, name in names.items()) or "none"
    plural = "organisations" if what == "organisation" else f"{what}s"
    raise UnknownScope(f"there is no {what} '{text}'; the {plural} are {known}")


def _checked(name: str, what: str) -> str:
    problem = scope_name_problem(name, what)
    if problem is not None:
        raise ScopeError(problem)
    return name


async def _insert(store: Store, sql: str, args: tuple[object, ...], duplicate: str, missing: str) -> int:
    try:
        async with store.transaction() as db:
            return await db.insert(sql, args)
    except MissingReference:
        raise UnknownScope(missing) from None
    except IntegrityError:
        raise ScopeInUse(duplicate) from None


async def create_org(store: Store, name: str) -> Org:
    _checked(name, "organisation")
    new_id = await _insert(
        store,
        "INSERT INTO orgs (name) VALUES (?)",
        (name,),
        duplicate=f"there is already an organisation called '{name}'",
        missing="",
    )
    return Org(new_id, name)


async def create_team(store: Store, org_id: int, name: str) -> Team:
    _checked(name, "team")
    new_id = await _insert(
        store,
        "INSERT INTO teams (org_id, name) VALUES (?, ?)",
        (org_id, name),
        duplicate=f"organisation {org_id} already has a team called '{name}'",
        missing=f"there is no organisation {org_id} to put the team '{name}' in",
    )
    return Team(new_id, org_id, name)


async def create_project(store: Store, team_id: int, name: str) -> Project:
    _checked(name, "project")
    new_id = await _insert(
        store,
        "INSERT INTO projects (team_id, name) VALUES (?, ?)",
        (team_id, name),
        duplicate=f"team {team_id} already has a project called '{name}'",
        missing=f"there is no team {team_id} to put the project '{name}' in",
    )
    return Project(new_id, team_id, name)


async def list_orgs(store: Store) -> list[Org]:
    return [
        Org(row["id"], row["name"]) for row in await store.fetch_all("SELECT id, name FROM orgs ORDER BY id")
    ]


async def list_teams(store: Store, org_id: int | None = None) -> list[Team]:
    sql = "SELECT id, org_id, name FROM teams"
    args: tuple[int, ...] = ()
    if org_id is not None:
        sql, args = sql + " WHERE org_id = ?", (org_id,)
    return [
        Team(row["id"], row["org_id"], row["name"])
        for row in await store.fetch_all(sql + " ORDER BY id", args)
    ]


async def list_projects(store: Store, team_id: int | None = None) -> list[Project]:
    sql = "SELECT id, team_id, name, models FROM projects"
    args: tuple[int, ...] = ()
    if team_id is not None:
        sql, args = sql + " WHERE team_id = ?", (team_id,)
    return [
        Project(
            row["id"],
            row["team_id"],
            row["name"],
            tuple(json.loads(row["models"])) if row["models"] is not None else None,
        )
        for row in await store.fetch_all(sql + " ORDER BY id", args)
    ]


async def list_deleted_projects(store: Store) -> list[DeletedProject]:
    """Every project deleted since the release that began recording them, with its team and org."""
    rows = await store.fetch_all(
        "SELECT project_id, team_id, org_id, name FROM deleted_projects ORDER BY project_id"
    )
    return [DeletedProject(row["project_id"], row["team_id"], row["org_id"], row["name"]) for row in rows]


async def load_hierarchy(store: Store) -> Hierarchy:
    return Hierarchy(
        orgs={o.id: o for o in await list_orgs(store)},
        teams={t.id: t for t in await list_teams(store)},
        projects={p.id: p for p in await list_projects(store)},
    )


# --- changes ----------------------------------------------------------------------------------

_TABLES = {"org": ("orgs", "organisation"), "team": ("teams", "team"), "project": ("projects", "project")}


async def rename(store: Store, scope: Scope, name: str) -> None:
    """Give an org, team or project a new name, unique within its parent as a new one's must be."""
    table, what = _TABLES[scope.kind]
    _checked(name, what)
    try:
        async with store.transaction() as db:
            changed = await db.execute(f"UPDATE {table} SET name = ? WHERE id = ?", (name, scope.id))
    except Duplicate:
        parent = {
            "org": "there is already an organisation",
            "team": "its organisation already has a team",
            "project": "its team already has a project",
        }[scope.kind]
        raise ScopeInUse(f"{parent} called '{name}'") from None
    if not changed:
        raise UnknownScope(f"there is no {what} {scope.id}")


async def _names(db: Queries, sql: str, args: tuple[object, ...]) -> list[str]:
    return [str(row[0]) for row in await db.fetch_all(sql, args)]


def _listed(names: Sequence[str], more_than: int = 5) -> str:
    shown = ", ".join(names[:more_than])
    return shown + (f" and {len(names) - more_than} more" if len(names) > more_than else "")


async def delete(store: Store, scope: Scope) -> str:
    """Delete an org, team or project that holds nothing any more; returns how it was named.

    Refused, naming what is left, while a project has live keys or members, a team projects, an
    organisation teams: a key whose project vanished would answer to no limit or budget. Its limits
    and budget go with it; a project's usage stays under its id, and what it spent still counts
    toward its team's and organisation's budgets (deleted_projects keeps which they were). The
    default ones stay, because keys and accounts go there unless told.
    """
    table, what = _TABLES[scope.kind]
    hierarchy = await load_hierarchy(store)
    described = hierarchy.name(scope)
    if scope.id == 1:
        raise ScopeInUse(f"the default {what} is where keys and accounts go when none is named; it stays")
    async with store.transaction() as db:
        if await db.fetch_one(f"SELECT 1 FROM {table} WHERE id = ?", (scope.id,)) is None:
            raise UnknownScope(f"there is no {what} {scope.id}")
        left: list[str] = []
        if scope.kind == "project":
            keys = await _names(
                db,
                "SELECT name || ' (' || prefix || '…)' FROM api_keys"
                " WHERE project_id = ? AND revoked_at IS NULL ORDER BY id",
                (scope.id,),
            )
            members = await _names(
                db, "SELECT email FROM users WHERE project_id = ? ORDER BY id", (scope.id,)
            )
            if keys:
                left.append(f"live keys {_listed(keys)} (revoke them with `llmgw keys revoke`)")
            if members:
                left.append(f"members {_listed(members)} (move them with `llmgw projects members remove`)")
        elif scope.kind == "team":
            projects = await _names(
                db, "SELECT name FROM projects WHERE team_id = ? ORDER BY id", (scope.id,)
            )
            if projects:
                left.append(f"projects {_listed(projects)}")
        else:
            teams = await _names(db, "SELECT name FROM teams WHERE org_id = ? ORDER BY id", (scope.id,))
            if teams:
                left.append(f"teams {_listed(teams)}")
        if left:
            raise ScopeInUse(f"{described} still has {' and '.join(left)}; it is kept until it has none")
        if scope.kind == "project":
            # Its usage stays under its id; this keeps it counted toward its team's and org's budgets.
            await db.execute(
                "INSERT INTO deleted_projects (project_id, team_id, org_id, name, deleted_at)"
                " SELECT p.id, p.team_id, t.org_id, p.name, ? FROM projects p"
                " JOIN teams t ON t.id = p.team_id WHERE p.id = ?",
                (datetime.now(UTC).isoformat(timespec="seconds"), scope.id),
            )
        await db.execute(f"DELETE FROM {table} WHERE id = ?", (scope.id,))
        for quota_table in ("limits", "budgets"):
            await db.execute(
                f"DELETE FROM {quota_table} WHERE scope_kind = ? AND scope_id = ?", (scope.kind, scope.id)
            )
    return described


async def set_project_models(store: Store, project_id: int, models: Sequence[str] | None) -> None:
    """Limit the project's keys to models (None: any model); a key's own list applies too."""
    if models is not None and any(not m.strip() for m in models):
        raise ScopeError("a model name cannot be empty")
    async with store.transaction() as db:
        changed = await db.execute(
            "UPDATE projects SET models = ? WHERE id = ?",
            (strictjson.dumps(list(models)) if models is not None else None, project_id),
        )
        if not changed:
            raise UnknownScope(f"there is no project {project_id}")
