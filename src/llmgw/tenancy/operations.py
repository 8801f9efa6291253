"""Organisations, teams, projects, members, quotas and prices: the operations behind the commands,
the admin API and the admin pages, each taking what a person typed (a name or an id) and answering
with the views of tenancy/views.py.

Every change goes to the store; a running gateway reloads limits, budgets,
prices and the hierarchy every second (gateway/quotas.py), so it binds within
a second wherever it was made.
"""

from __future__ import annotations

import csv
import enum
import io
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Final, Literal

import attrs

from llmgw import names
from llmgw.config import ModelConfig, ServerConfig
from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, problem
from llmgw.pricing import price_of, unpriced, unpriced_sentence
from llmgw.store import Store, scopes
from llmgw.store import prices as stored_prices
from llmgw.store.keys import KeyRecord, list_keys
from llmgw.store.quotas import (
    PERIODS,
    Budget,
    Limits,
    clear_budget,
    list_budgets,
    list_limits,
    set_budget,
    set_limits,
)
from llmgw.store.scopes import Hierarchy, Scope, ScopeError, ScopeInUse, UnknownScope, load_hierarchy
from llmgw.store.usage import UsageBy, usage_totals
from llmgw.store.users import (
    AccountError,
    User,
    approve_user,
    get_user,
    get_user_by_email,
    leave_project,
    list_users,
)
from llmgw.tenancy import views as tv

Level = Literal["org", "team", "project"]
Spent = Callable[[Scope], float | None]


class _Keep(enum.Enum):
    KEEP = "keep"


KEEP: Final = _Keep.KEEP


# --- scopes by name ---------------------------------------------------------------------------


def _id(hierarchy: Hierarchy, kind: Level, text: str) -> int:
    if kind == "org":
        return hierarchy.org_id(text)
    if kind == "team":
        return hierarchy.team_id(text)
    return hierarchy.project_id(text)


_SCOPE_TEXT: dict[str, Level | None] = {"org": "org", "team": "team", "project": "project", "key": None}


async def find_scope(store: Store, text: str) -> tuple[Scope, str]:
    """The scope `org:NAME`, `team:NAME`, `project:NAME` (or :ID) or `key:PREFIX` names, and its name."""
    kind, _, name = text.strip().partition(":")
    name = name.strip()
    if kind not in _SCOPE_TEXT or not name:
        raise ScopeError(
            f"'{text}' is not a scope: write org:NAME, team:NAME, project:NAME (an id works for a name) "
            "or key:PREFIX"
        )
    hierarchy = await load_hierarchy(store)
    level = _SCOPE_TEXT[kind]
    if level is not None:
        scope = Scope(level, _id(hierarchy, level, name))
        return scope, hierarchy.name(scope)
    # Pasted from `llmgw keys list`, a prefix may carry its ellipsis.
    prefix = name.rstrip("…")
    keys = [k for k in await list_keys(store) if k.prefix == prefix or k.prefix.startswith(prefix)]
    exact = [k for k in keys if k.prefix == prefix]
    keys = exact or keys
    if not keys:
        raise UnknownScope(f"no key has the prefix '{prefix}'; `llmgw keys list` shows them")
    if len(keys) > 1:
        shown = ", ".join(f"{k.prefix}… ({k.name})" for k in keys[:5])
        raise ScopeError(f"several keys start with '{prefix}': {shown}; give more of the prefix")
    key = keys[0]
    where = hierarchy.name(Scope("project", key.project_id))
    return Scope("key", key.id), f"key '{key.name}' ({key.prefix}…) in {where}"


# --- the hierarchy ----------------------------------------------------------------------------


def org_view(hierarchy: Hierarchy, org_id: int) -> tv.Org:
    return tv.Org(id=org_id, name=hierarchy.orgs[org_id].name)


def team_view(hierarchy: Hierarchy, team_id: int) -> tv.Team:
    team = hierarchy.teams[team_id]
    return tv.Team(id=team.id, name=team.name, org_id=team.org_id, org=hierarchy.orgs[team.org_id].name)


def project_view(hierarchy: Hierarchy, project_id: int) -> tv.Project:
    chain = hierarchy.chain(project_id)
    return tv.Project(
        id=chain.project.id,
        name=chain.project.name,
        team_id=chain.team.id,
        team=chain.team.name,
        org_id=chain.org.id,
        org=chain.org.name,
        models=list(chain.project.models) if chain.project.models is not None else None,
    )


async def list_level(
    store: Store, kind: Level, parent: str | None = None
) -> list[tv.Org | tv.Team | tv.Project]:
    """Every org, team or project; teams of one org, projects of one team when parent names it."""
    hierarchy = await load_hierarchy(store)
    if kind == "org":
        return [org_view(hierarchy, i) for i in hierarchy.orgs]
    if kind == "team":
        org = hierarchy.org_id(parent) if parent else None
        return [team_view(hierarchy, t.id) for t in hierarchy.teams.values() if org in (None, t.org_id)]
    team = hierarchy.team_id(parent) if parent else None
    return [project_view(hierarchy, p.id) for p in hierarchy.projects.values() if team in (None, p.team_id)]


async def create(store: Store, kind: Level, name: str, parent: str = "") -> tv.Org | tv.Team | tv.Project:
    """A new org, team (parent: its org) or project (parent: its team), parent by id or name."""
    hierarchy = await load_hierarchy(store)
    if kind == "org":
        org = await scopes.create_org(store, name)
        return tv.Org(id=org.id, name=org.name)
    if not parent:
        above = "organisation" if kind == "team" else "team"
        raise ScopeError(f"say which {above} the {kind} '{name}' goes in")
    if kind == "team":
        org_id = hierarchy.org_id(parent)
        if any(t.org_id == org_id and t.name == name for t in hierarchy.teams.values()):
            raise ScopeInUse(f"{hierarchy.name(Scope('org', org_id))} already has a team called '{name}'")
        team = await scopes.create_team(store, org_id, name)
        return team_view(await load_hierarchy(store), team.id)
    team_id = hierarchy.team_id(parent)
    if any(p.team_id == team_id and p.name == name for p in hierarchy.projects.values()):
        raise ScopeInUse(f"{hierarchy.name(Scope('team', team_id))} already has a project called '{name}'")
    project = await scopes.create_project(store, team_id, name)
    return project_view(await load_hierarchy(store), project.id)


async def rename(store: Store, kind: Level, text: str, name: str) -> tv.Org | tv.Team | tv.Project:
    scope = Scope(kind, _id(await load_hierarchy(store), kind, text))
    await scopes.rename(store, scope, name)
    hierarchy = await load_hierarchy(store)
    if kind == "org":
        return org_view(hierarchy, scope.id)
    if kind == "team":
        return team_view(hierarchy, scope.id)
    return project_view(hierarchy, scope.id)


async def delete(store: Store, kind: Level, text: str) -> tv.Deleted:
    scope = Scope(kind, _id(await load_hierarchy(store), kind, text))
    return tv.Deleted(name=await scopes.delete(store, scope), deleted=True)


async def set_models(store: Store, project: str, models: Sequence[str] | None) -> tv.Project:
    """Limit a project's keys to models (None: any); each key's own list still applies."""
    project_id = (await load_hierarchy(store)).project_id(project)
    await scopes.set_project_models(
        store, project_id, None if models is None else list(dict.fromkeys(models))
    )
    return project_view(await load_hierarchy(store), project_id)


# --- members ----------------------------------------------------------------------------------


def member_view(user: User) -> tv.Member:
    return tv.Member(
        id=user.id, email=user.email, status=user.status, admin=user.is_admin, project_id=user.project_id
    )


async def _user(store: Store, text: str) -> User:
    text = text.strip()
    user_id = names.id_number(text)
    user = await get_user(store, user_id) if user_id is not None else await get_user_by_email(store, text)
    if user is None:
        raise UnknownScope(f"there is no account '{text}'; `llmgw users list` shows them")
    return user


async def members(store: Store, project: str) -> list[tv.Member]:
    project_id = (await load_hierarchy(store)).project_id(project)
    return [member_view(u) for u in await list_users(store) if u.project_id == project_id]


async def add_member(store: Store, project: str, user: str) -> tv.Member:
    """Put the account in the project (out of any other), approving it if it was pending.

    A disabled account stays disabled: adding it to a project is not the way to let it back in.
    """
    project_id = (await load_hierarchy(store)).project_id(project)
    found = await _user(store, user)
    if found.status == "disabled":
        raise AccountError(
            f"the account {found.email} is disabled; re-enable it with `llmgw users approve {found.id} "
            f"--project {project_id}` if it should come back"
        )
    return member_view(await approve_user(store, found.id, project_id))


async def remove_member(store: Store, project: str, user: str) -> tv.Member:
    """Take the account out of the project: it keeps signing in, and can create no keys until it joins one."""
    hierarchy = await load_hierarchy(store)
    project_id = hierarchy.project_id(project)
    found = await _user(store, user)
    if found.project_id != project_id:
        raise AccountError(f"{found.email} is not a member of {hierarchy.name(Scope('project', project_id))}")
    return member_view(await leave_project(store, found.id))


# --- quotas -----------------------------------------------------------------------------------


async def quotas(store: Store, spent: Spent | None = None) -> list[tv.Quota]:
    """Every scope with a limit or a budget, orgs first, then teams, projects and keys."""
    limits = {item.scope: item for item in await list_limits(store)}
    budgets = {item.scope: item for item in await list_budgets(store)}
    order = {"org": 0, "team": 1, "project": 2, "key": 3}
    found = sorted({*limits, *budgets}, key=lambda s: (order[s.kind], s.id))
    hierarchy = await load_hierarchy(store)
    keys = {k.id: k for k in await list_keys(store)}
    return [
        _quota_view(scope, _named(scope, hierarchy, keys), limits.get(scope), budgets.get(scope), spent)
        for scope in found
    ]


def _quota_view(
    scope: Scope, name: str, limits: Limits | None, budget: Budget | None, spent: Spent | None
) -> tv.Quota:
    return tv.Quota(
        scope=str(scope),
        name=name,
        rpm=limits.rpm if limits else None,
        tpm=limits.tpm if limits else None,
        budget=budget.amount if budget else None,
        period=budget.period if budget else None,
        spent=spent(scope) if spent is not None and budget is not None else None,
    )


async def _quota(store: Store, scope: Scope, spent: Spent | None, name: str) -> tv.Quota:
    limits = next((item for item in await list_limits(store) if item.scope == scope), None)
    budget = next((item for item in await list_budgets(store) if item.scope == scope), None)
    return _quota_view(scope, name, limits, budget, spent)


def _named(scope: Scope, hierarchy: Hierarchy, keys: Mapping[int, KeyRecord]) -> str:
    if scope.kind != "key":
        return hierarchy.name(scope)
    key = keys.get(scope.id)
    return f"key '{key.name}' ({key.prefix}…)" if key is not None else f"key {scope.id}"


async def set_quota(
    store: Store,
    text: str,
    *,
    rpm: int | _Keep | None = KEEP,
    tpm: int | _Keep | None = KEEP,
    budget: float | _Keep | None = KEEP,
    period: str | None = None,
    spent: Spent | None = None,
) -> tv.Quota:
    """Change what is given of the scope's limits and budget; KEEP leaves a value as it was, None clears it.

    A budget needs its period the first time; after that a new amount keeps the period it had.
    """
    scope, name = await find_scope(store, text)
    # Held here as well as by the store: a budget refused after the limits were written left half a change.
    for label, value in (("rpm", rpm), ("tpm", tpm)):
        said = problem(label, value, MAX_PER_MINUTE, whole=True) if isinstance(value, int) else None
        if said is not None:
            raise ScopeError(f"{said} (0 refuses every request)")
    if isinstance(budget, (int, float)):
        said = problem("the budget", budget, MAX_BUDGET, whole=False)
        if said is not None:
            raise ScopeError(said)
    if period is not None and period not in PERIODS:
        raise ScopeError(f"a budget's period is one of {', '.join(PERIODS)}, not '{period}'")
    before = await _quota(store, scope, None, name)
    new_rpm = before.rpm if rpm is KEEP else rpm
    new_tpm = before.tpm if tpm is KEEP else tpm
    assert not isinstance(new_rpm, _Keep) and not isinstance(new_tpm, _Keep)
    if rpm is not KEEP or tpm is not KEEP:
        await set_limits(store, scope, new_rpm, new_tpm)
    if budget is None:
        await clear_budget(store, scope)
    elif budget is not KEEP:
        chosen = period or before.period
        if chosen is None:
            raise ScopeError(f"say how often the budget of {name} renews: a period of {', '.join(PERIODS)}")
        await set_budget(store, scope, budget, chosen)
    elif period is not None:
        if before.budget is None:
            raise ScopeError(f"{name} has no budget to give a period to; set one with an amount")
        await set_budget(store, scope, before.budget, period)
    return await _quota(store, scope, spent, name)


async def with_unpriced(
    store: Store, cfg: ServerConfig, models: Sequence[ModelConfig], quota: tv.Quota
) -> tv.Quota:
    """quota, saying that budgets never bind on the catalog's unpriced models when it has a budget.

    Said where the budget is set (the API's reply, `llmgw quotas set`), not only at the next start.
    """
    if quota.budget is None:
        return quota
    stored = {p.model: p.price for p in await stored_prices.list_prices(store)}
    missing = unpriced(cfg, models, stored)
    return attrs.evolve(quota, unpriced=unpriced_sentence(missing)) if missing else quota


async def clear_quota(store: Store, text: str) -> tv.Quota:
    """Remove the scope's limits and budget: a scope above it, or server.yaml's defaults, apply again."""
    scope, name = await find_scope(store, text)
    await set_limits(store, scope, None, None)
    await clear_budget(store, scope)
    return await _quota(store, scope, None, name)


# --- prices -----------------------------------------------------------------------------------


def _price_view(
    cfg: ServerConfig,
    model: str,
    definition: ModelConfig | None,
    stored: dict[str, stored_prices.StoredPrice],
) -> tv.Price:
    price = price_of(cfg, model, definition, {m: p.price for m, p in stored.items()})
    source: tv.PriceSource
    if model in stored:
        source = "set"
    elif definition is not None and definition.pricing is not None:
        source = "model"
    elif model in cfg.pricing:
        source = "pricing"
    elif price is not None:
        source = "default"
    else:
        source = "none"
    return tv.Price(
        model=model,
        prompt_per_1k=price.prompt_per_1k if price else None,
        completion_per_1k=price.completion_per_1k if price else None,
        source=source,
    )


async def prices(store: Store, cfg: ServerConfig, models: Sequence[ModelConfig]) -> list[tv.Price]:
    """The price of every model of the catalog, and of every model a price was set for."""
    stored = {p.model: p for p in await stored_prices.list_prices(store)}
    definitions = {m.name: m for m in models}
    names = sorted({*definitions, *stored})
    return [_price_view(cfg, name, definitions.get(name), stored) for name in names]


async def set_price(
    store: Store,
    cfg: ServerConfig,
    models: Sequence[ModelConfig],
    model: str,
    prompt: float,
    completion: float,
) -> tv.Price:
    # A price may be set before its model is added, so it is held to what a model's name may be.
    problem = names.model_name_problem(model)
    if problem is not None:
        raise ScopeError(problem)
    await stored_prices.set_price(store, model, prompt, completion)
    return next(p for p in await prices(store, cfg, models) if p.model == model)


async def clear_price(store: Store, cfg: ServerConfig, models: Sequence[ModelConfig], model: str) -> tv.Price:
    if not await stored_prices.clear_price(store, model):
        raise UnknownScope(
            f"no price was set for {model} with `llmgw prices set`; `llmgw prices list` shows them"
        )
    definition = next((m for m in models if m.name == model), None)
    return _price_view(cfg, model, definition, {})


# --- usage ------------------------------------------------------------------------------------


async def usage(
    store: Store, by: UsageBy = "project", since: date | None = None, until: date | None = None
) -> list[tv.UsageRow]:
    """The store's usage added up by org, team, project, key or model, from since to until (inclusive)."""
    if since is not None and until is not None and since > until:
        raise ScopeError(f"--since {since} is after --until {until}: nothing is between them")
    hierarchy = await load_hierarchy(store)
    keys = {k.id: k for k in await list_keys(store)} if by == "key" else {}

    def name(group: int | str | None) -> str:
        if group is None:
            return "projects deleted by an earlier release"
        if by == "model":
            return str(group)
        if by == "key":
            key = keys.get(int(group))
            if key is None:
                return "no key (auth disabled)" if group == 0 else f"key {group}"
            return f"key '{key.name}' ({key.prefix}…)"
        return hierarchy.name(Scope(by, int(group)))

    return [
        tv.UsageRow(
            by=by,
            id="" if total.group is None else str(total.group),
            name=name(total.group),
            requests=total.requests,
            errors=total.errors,
            prompt_tokens=total.prompt_tokens,
            completion_tokens=total.completion_tokens,
            total_tokens=total.prompt_tokens + total.completion_tokens,
            cost=total.cost,
        )
        for total in await usage_totals(store, by, since, until)
    ]


USAGE_COLUMNS = (
    "by",
    "id",
    "name",
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost",
)


def _cell(value: object) -> str:
    text = str(value)
    # A name a spreadsheet would run as a formula (=HYPERLINK(…), +cmd…) is kept as text.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def usage_csv(rows: Sequence[tv.UsageRow]) -> str:
    """The rows as CSV, a header first; a cell that starts like a formula starts with ' instead."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(USAGE_COLUMNS)
    for row in rows:
        writer.writerow([_cell(getattr(row, column)) for column in USAGE_COLUMNS])
    return out.getvalue()
