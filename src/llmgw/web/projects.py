"""The projects page: organisations, teams and projects, their members and models, for administrators.

The same operations as `llmgw orgs|teams|projects` and the admin API (tenancy/operations.py);
limits and budgets are on the quotas page, which lists every scope made here.
"""

from __future__ import annotations

from urllib.parse import urlencode

from aiohttp import web

from llmgw.bodies import read_fields
from llmgw.errors import LlmgwError
from llmgw.names import id_number
from llmgw.store.scopes import Scope, load_hierarchy
from llmgw.store.users import list_users
from llmgw.tenancy import operations as tenancy
from llmgw.web.context import WEB_KEY
from llmgw.web.guards import require_admin
from llmgw.web.render import render

_LEVELS: dict[str, tenancy.Level] = {"org": "org", "team": "team", "project": "project"}
# After an action the page says what was done from these, never from words in the link: a link
# must not be able to put words of its own on an admin page.
_DONE = {
    "create": "Created {name}.",
    "rename": "Renamed: it is {name} now.",
    "delete": "Deleted.",
    "member-add": "Added the account to {name}.",
    "member-remove": "Took the account out of {name}.",
    "models": "Saved the models of {name}; a running gateway applies them within a second.",
}


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}" + ("" if text.endswith(".") else ".")


async def _page(
    request: web.Request, status: int = 200, flash: str | None = None, kind: str = "ok"
) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    hierarchy = await load_hierarchy(ctx.store)
    users = await list_users(ctx.store)
    members = {p: [u for u in users if u.project_id == p] for p in hierarchy.projects}
    return await render(
        request,
        "admin_projects.html",
        status=status,
        orgs=[tenancy.org_view(hierarchy, i) for i in hierarchy.orgs],
        teams=[tenancy.team_view(hierarchy, i) for i in hierarchy.teams],
        projects=[tenancy.project_view(hierarchy, i) for i in hierarchy.projects],
        members=members,
        flash=flash,
        flash_kind=kind,
    )


@require_admin
async def projects_page(request: web.Request) -> web.StreamResponse:
    flash = None
    done = request.query.get("done", "")
    level, item = request.query.get("kind", ""), request.query.get("id", "")
    if done in _DONE:
        name = ""
        item_id = id_number(item)
        if level in _LEVELS and item_id is not None:
            hierarchy = await load_hierarchy(request.config_dict[WEB_KEY].store)
            name = hierarchy.name(Scope(_LEVELS[level], item_id))
        flash = _DONE[done].format(name=name)
    return await _page(request, flash=flash)


@require_admin
async def projects_action(request: web.Request) -> web.StreamResponse:
    store = request.config_dict[WEB_KEY].store
    action = request.match_info["action"]
    form = await read_fields(request)
    level = _LEVELS.get(form.get("kind", ""), "project")
    item = form.get("id", "")
    try:
        if action == "create":
            made = await tenancy.create(store, level, form.get("name", ""), form.get("parent", ""))
            item = str(made.id)
        elif action == "rename":
            await tenancy.rename(store, level, item, form.get("name", ""))
        elif action == "delete":
            await tenancy.delete(store, level, item)
        elif action == "member-add":
            await tenancy.add_member(store, item, form.get("user", ""))
        elif action == "member-remove":
            await tenancy.remove_member(store, item, form.get("user", ""))
        else:  # models: the route admits only these
            text = form.get("models", "").strip()
            models = None if not text else [m.strip() for m in text.split(",") if m.strip()]
            await tenancy.set_models(store, item, models)
    except LlmgwError as exc:
        return await _page(request, 400, _sentence(str(exc)), "error")
    query = {"done": action} if action == "delete" else {"done": action, "kind": level, "id": item}
    # Post, redirect, get: reloading the page must not repeat the action.
    return web.Response(status=303, headers={"Location": f"/admin/projects?{urlencode(query)}"})
