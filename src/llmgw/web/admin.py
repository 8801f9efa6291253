"""Admin pages on the client port: users (approve, promote, disable), quotas (editable) and usage."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlencode

import attrs
import structlog
from aiohttp import web

from llmgw import maxima
from llmgw.adminapi.tenancy import BadQuery, usage_query
from llmgw.bodies import read_fields
from llmgw.catalog import CATALOG_KEY
from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE
from llmgw.names import id_number
from llmgw.pricing import budget_warnings, unpriced, unpriced_sentence
from llmgw.store.keys import list_keys
from llmgw.store.prices import list_prices
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
from llmgw.store.scopes import Scope, ScopeError, load_hierarchy
from llmgw.store.sessions import end_user_sessions
from llmgw.store.usage import USAGE_BY, usage_by_day
from llmgw.store.users import (
    AccountError,
    approve_user,
    disable_user,
    get_user,
    list_users,
    promote_user,
    revoke_user_keys,
)
from llmgw.tenancy import operations as tenancy
from llmgw.web.chart import Series, colour, stacked_bars
from llmgw.web.context import WEB_KEY
from llmgw.web.guards import require_admin
from llmgw.web.render import render
from llmgw.web.sessions import current_user

log = structlog.get_logger(__name__)

_DEFAULT_DAYS = 30
_MAX_DAYS = 366


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}" + ("" if text.endswith(".") else ".")


@require_admin
async def admin_root(request: web.Request) -> web.StreamResponse:
    return _see_other("/admin/users")


async def _users_page(
    request: web.Request, status: int = 200, flash: str | None = None, kind: str = "ok"
) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    hierarchy = await load_hierarchy(ctx.store)
    projects = [(p.id, hierarchy.name(Scope("project", p.id))) for p in hierarchy.projects.values()]
    users = await list_users(ctx.store)
    memberships = {
        u.id: hierarchy.name(Scope("project", u.project_id)) if u.project_id is not None else ""
        for u in users
    }
    me = await current_user(request)
    return await render(
        request,
        "admin_users.html",
        status=status,
        users=users,
        memberships=memberships,
        projects=projects,
        me=me,
        failed_logins=ctx.logins.recent(),
        flash=flash,
        flash_kind=kind,
    )


_DONE = {
    "approve": "{email} is approved into {project}.",
    "promote": "{email} is now an administrator.",
    "disable": "{email} is disabled and signed out everywhere.",
}


@require_admin
async def users_page(request: web.Request) -> web.StreamResponse:
    # The redirect after an action names it and the user, never a message:
    # a link must not be able to put words of its own on an admin page.
    flash = None
    done, user_id = request.query.get("done", ""), request.query.get("user", "")
    if done in _DONE and id_number(user_id) is not None:
        ctx = request.config_dict[WEB_KEY]
        user = await get_user(ctx.store, int(user_id))
        if user is not None:
            project = ""
            if user.project_id is not None:
                project = (await load_hierarchy(ctx.store)).name(Scope("project", user.project_id))
            flash = _DONE[done].format(email=user.email, project=project)
    return await _users_page(request, flash=flash)


@require_admin
async def user_action(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    user_id = int(request.match_info["user_id"])
    action = request.match_info["action"]
    form = await read_fields(request)
    try:
        if action == "approve":
            project = form.get("project", "")
            hierarchy = await load_hierarchy(ctx.store)
            project_id = id_number(project)
            if project_id is None or project_id not in hierarchy.projects:
                return await _users_page(
                    request, 400, "Choose the project to approve the account into.", "error"
                )
            await approve_user(ctx.store, user_id, project_id)
        elif action == "promote":
            await promote_user(ctx.store, user_id)
        else:  # disable: the route admits only these three
            me = await current_user(request)
            if me is not None and me.id == user_id:
                return await _users_page(
                    request, 400, "You cannot disable your own account: another administrator must.", "error"
                )
            await disable_user(ctx.store, user_id)
            await end_user_sessions(ctx.store, user_id)
            if ctx.cfg.auth.disabled_user_keys == "revoke":
                await revoke_user_keys(ctx.store, user_id)
    except AccountError as exc:
        return await _users_page(request, 400, _sentence(str(exc)), "error")
    # Post, redirect, get: reloading the page must not repeat the action.
    return _see_other(f"/admin/users?{urlencode({'done': action, 'user': user_id})}")


@attrs.frozen
class _QuotaRow:
    scope: Scope
    name: str
    limits: Limits | None
    budget: Budget | None
    spent: float | None


async def _quotas_page(
    request: web.Request, status: int = 200, flash: str | None = None, kind: str = "ok"
) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    hierarchy = await load_hierarchy(ctx.store)
    limits = {item.scope: item for item in await list_limits(ctx.store)}
    budgets = {item.scope: item for item in await list_budgets(ctx.store)}
    scopes = [Scope("org", i) for i in hierarchy.orgs] + [Scope("team", i) for i in hierarchy.teams]
    scopes += [Scope("project", i) for i in hierarchy.projects]
    keys = {key.id: key for key in await list_keys(ctx.store)}
    scopes += [Scope("key", key.id) for key in keys.values() if key.revoked_at is None]
    # A revoked key's quota stays listed while it has one, so that it can be cleared.
    scopes += [s for s in (*limits, *budgets) if s.kind == "key" and s not in scopes]

    def name(scope: Scope) -> str:
        if scope.kind == "key" and scope.id in keys:
            key = keys[scope.id]
            return f"key '{key.name}' ({key.prefix}…) in {hierarchy.name(Scope('project', key.project_id))}"
        return hierarchy.name(scope)

    rows = [
        _QuotaRow(
            scope,
            name(scope),
            limits.get(scope),
            budgets.get(scope),
            ctx.spent(scope) if ctx.spent is not None and scope in budgets else None,
        )
        for scope in dict.fromkeys(scopes)
    ]
    return await render(
        request,
        "admin_quotas.html",
        status=status,
        rows=rows,
        periods=PERIODS,
        warnings=budget_warnings(
            ctx.cfg,
            list(budgets.values()),
            request.config_dict[CATALOG_KEY].models(),
            {p.model: p.price for p in await list_prices(ctx.store)},
        ),
        default_rpm=ctx.cfg.auth.default_rpm,
        default_tpm=ctx.cfg.auth.default_tpm,
        max_per_minute=MAX_PER_MINUTE,
        max_budget=MAX_BUDGET,
        flash=flash,
        flash_kind=kind,
    )


@require_admin
async def quotas_page(request: web.Request) -> web.StreamResponse:
    flash = None
    if request.query.get("saved"):
        try:
            scope = Scope.parse(request.query["saved"])
        except ScopeError:
            scope = None
        if scope is not None:
            ctx = request.config_dict[WEB_KEY]
            name = (await load_hierarchy(ctx.store)).name(scope)
            flash = f"Saved the quotas of {name}; a running gateway applies them within a second."
            missing = await _unpriced_if_budgeted(request, scope, await list_budgets(ctx.store))
            if missing:
                # Said with the save, not only in the list at the top: the one who set the budget
                # should not find out at the month's end that it never bound.
                flash += f" This budget does not bind everything: {unpriced_sentence(missing)}."
                return await _quotas_page(request, flash=flash, kind="error")
    return await _quotas_page(request, flash=flash)


async def _unpriced_if_budgeted(request: web.Request, scope: Scope, budgets: list[Budget]) -> list[str]:
    """The catalog's unpriced models (prices in the store count), when scope has a budget; else none."""
    if not any(budget.scope == scope for budget in budgets):
        return []
    ctx = request.config_dict[WEB_KEY]
    stored = {p.model: p.price for p in await list_prices(ctx.store)}
    return unpriced(ctx.cfg, request.config_dict[CATALOG_KEY].models(), stored)


def _optional_number(form: dict[str, str], field: str, most: int, *, whole: bool) -> int | float | None:
    """The form's field as a number from 0 to most; None when it is empty. Read before anything is
    written: a budget refused after the limits were saved left half a change."""
    text = form.get(field, "").strip()
    if not text:
        return None
    try:
        return maxima.read(text, field, most, whole=whole)
    except ValueError as exc:
        raise ScopeError(f"{exc}, or leave it empty for none") from None


@require_admin
async def save_quota(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    form = await read_fields(request)
    try:
        scope = Scope.parse(form.get("scope", ""))
        rpm = _optional_number(form, "rpm", MAX_PER_MINUTE, whole=True)
        tpm = _optional_number(form, "tpm", MAX_PER_MINUTE, whole=True)
        budget = _optional_number(form, "budget", MAX_BUDGET, whole=False)
        await set_limits(
            ctx.store, scope, None if rpm is None else int(rpm), None if tpm is None else int(tpm)
        )
        if budget is None:
            await clear_budget(ctx.store, scope)
        else:
            await set_budget(ctx.store, scope, float(budget), form.get("period", "month"))
            stored = {p.model: p.price for p in await list_prices(ctx.store)}
            missing = unpriced(ctx.cfg, request.config_dict[CATALOG_KEY].models(), stored)
            if missing:
                # Logged when it happens, not only at the server's next start.
                log.warning(
                    "a budget was set but no price applies to some models: it never binds on them",
                    scope=str(scope),
                    models=missing,
                )
    except ScopeError as exc:
        return await _quotas_page(request, 400, _sentence(str(exc)), "error")
    return _see_other(f"/admin/quotas?{urlencode({'saved': str(scope)})}")


@attrs.frozen
class _ProjectTotal:
    name: str
    colour: str
    tokens: int
    requests: int
    cost: float


@require_admin
async def usage_page(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    text = request.query.get("days", str(_DEFAULT_DAYS))
    asked = id_number(text)
    days_back = min(asked, _MAX_DAYS) if asked else _DEFAULT_DAYS
    today = datetime.now(UTC).date()
    since = today - timedelta(days=days_back - 1)
    rows = await usage_by_day(ctx.store, since=since, until=today)
    hierarchy = await load_hierarchy(ctx.store)
    project_ids = sorted({row.project_id for row in rows})
    index = {project_id: i for i, project_id in enumerate(project_ids)}
    series = [Series(hierarchy.name(Scope("project", p)), colour(i)) for i, p in enumerate(project_ids)]
    values: dict[tuple[date, int], float] = defaultdict(float)
    sums: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for row in rows:
        values[(row.day, index[row.project_id])] += row.total_tokens
        total = sums[row.project_id]
        total[0] += row.total_tokens
        total[1] += row.requests
        total[2] += row.cost
    days = [since + timedelta(days=i) for i in range(days_back)]
    chart = stacked_bars(days, series, values, f"Tokens per day per project, {since} to {today} (UTC)")
    projects = [
        _ProjectTotal(
            series[index[p]].label, series[index[p]].colour, int(sums[p][0]), int(sums[p][1]), sums[p][2]
        )
        for p in project_ids
    ]
    names = {p: series[index[p]].label for p in project_ids}
    return await render(
        request,
        "admin_usage.html",
        usage_by=USAGE_BY,
        chart=chart,
        projects=projects,
        rows=list(reversed(rows)),
        names=names,
        days=days_back,
        since=since,
        today=today,
    )


@require_admin
async def usage_csv(request: web.Request) -> web.StreamResponse:
    """The usage page's range, added up by org, team, project, key or model, as a CSV file."""
    ctx = request.config_dict[WEB_KEY]
    try:
        by, since, until = usage_query(request.query)
        rows = await tenancy.usage(ctx.store, by, since, until)
    except (BadQuery, ScopeError) as exc:
        return await render(
            request, "message.html", status=400, title="Cannot export", message=_sentence(str(exc))
        )
    name = f"llmgw-usage-by-{by}-{since or 'start'}-to-{until or 'now'}.csv"
    return web.Response(
        text=tenancy.usage_csv(rows),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
