"""The OpenAPI description of the admin API's tenancy routes (adminapi/tenancy.py serves them).

Apart from the handlers so that the document (adminapi/openapi.py) can list these routes without
importing the admin API, which serves the document.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmgw.adminapi import views
from llmgw.adminapi.schema import ref
from llmgw.tenancy import views as tv

# What a team or a project is created in.
PARENTS = {"teams": "org", "projects": "team"}


@attrs.frozen
class Route:
    method: str
    path: str
    operation: str
    summary: str
    # status -> (the reply's view, or a list of it; description)
    replies: dict[int, tuple[Any, str]]
    body: type | None = None
    parameters: tuple[dict[str, Any], ...] = ()


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


_ITEM = {
    "orgs": _path("item", "The organisation's id or name."),
    "teams": _path("item", "The team's id or name."),
    "projects": _path("item", "The project's id or name."),
}
_SCOPE = _path("scope", "org:NAME, team:NAME, project:NAME (an id works for a name) or key:PREFIX.")
_MODEL = _path("model", "The model's name; it may hold slashes.")
_BAD = "What is wrong with the request, in a sentence."
_MISSING = "Something it names does not exist."
_TAKEN = "The name is taken, or something still belongs to it."


def _level_routes(collection: str, view: type, what: str) -> list[Route]:
    parent = PARENTS.get(collection)
    query = (
        (
            {
                "name": parent,
                "in": "query",
                "description": f"Only those of this {parent} (id or name).",
                "schema": {"type": "string"},
            },
        )
        if parent
        else ()
    )
    base = f"/api/v1/{collection}"
    # Only a team or a project names something else (its parent) that may not exist.
    missing = {404: (views.Error, _MISSING)} if parent else {}
    return [
        Route(
            "GET",
            base,
            f"list{what}s",
            f"Every {what.lower()}.",
            {200: ([view], f"The {what.lower()}s."), **missing},
            parameters=query,
        ),
        Route(
            "POST",
            base,
            f"create{what}",
            f"Create a {what.lower()}.",
            {
                201: (view, "It was created."),
                400: (views.Error, _BAD),
                **missing,
                409: (views.Error, _TAKEN),
            },
            body=tv.NameChange,
        ),
        Route(
            "PATCH",
            base + "/{item}",
            f"rename{what}",
            f"Rename a {what.lower()}.",
            {
                200: (view, "Renamed."),
                400: (views.Error, _BAD),
                404: (views.Error, _MISSING),
                409: (views.Error, _TAKEN),
            },
            body=tv.NameChange,
            parameters=(_ITEM[collection],),
        ),
        Route(
            "DELETE",
            base + "/{item}",
            f"delete{what}",
            f"Delete a {what.lower()} that holds nothing any more, with its limits and budget.",
            {200: (tv.Deleted, "Deleted."), 404: (views.Error, _MISSING), 409: (views.Error, _TAKEN)},
            parameters=(_ITEM[collection],),
        ),
    ]


ROUTES: tuple[Route, ...] = (
    *_level_routes("orgs", tv.Org, "Org"),
    *_level_routes("teams", tv.Team, "Team"),
    *_level_routes("projects", tv.Project, "Project"),
    Route(
        "PUT",
        "/api/v1/projects/{item}/models",
        "setProjectModels",
        "Limit a project's keys to some models (null: any); each key's own list applies too.",
        {200: (tv.Project, "The project."), 400: (views.Error, _BAD), 404: (views.Error, _MISSING)},
        body=tv.ModelsChange,
        parameters=(_ITEM["projects"],),
    ),
    Route(
        "GET",
        "/api/v1/projects/{item}/members",
        "listMembers",
        "The accounts in a project.",
        {200: ([tv.Member], "Its members."), 404: (views.Error, _MISSING)},
        parameters=(_ITEM["projects"],),
    ),
    Route(
        "POST",
        "/api/v1/projects/{item}/members",
        "addMember",
        "Put an account in the project (out of any other); a pending one is approved.",
        {200: (tv.Member, "The account."), 400: (views.Error, _BAD), 404: (views.Error, _MISSING)},
        body=tv.MemberChange,
        parameters=(_ITEM["projects"],),
    ),
    Route(
        "DELETE",
        "/api/v1/projects/{item}/members/{user}",
        "removeMember",
        "Take an account out of the project; it can create no keys until it joins another.",
        {200: (tv.Member, "The account."), 400: (views.Error, _BAD), 404: (views.Error, _MISSING)},
        parameters=(_ITEM["projects"], _path("user", "The account's id or email.")),
    ),
    Route(
        "GET",
        "/api/v1/quotas",
        "listQuotas",
        "Every scope with a limit or a budget.",
        {200: ([tv.Quota], "Orgs, teams, projects, then keys.")},
    ),
    Route(
        "PUT",
        "/api/v1/quotas/{scope}",
        "setQuota",
        "Change a scope's limits and budget: a field left out stays, null clears it; binds within a second.",
        {200: (tv.Quota, "The scope's quota now."), 400: (views.Error, _BAD), 404: (views.Error, _MISSING)},
        body=tv.QuotaChange,
        parameters=(_SCOPE,),
    ),
    Route(
        "DELETE",
        "/api/v1/quotas/{scope}",
        "clearQuota",
        "Remove a scope's limits and budget.",
        {
            200: (tv.Quota, "The scope's quota now: none."),
            400: (views.Error, _BAD),
            404: (views.Error, _MISSING),
        },
        parameters=(_SCOPE,),
    ),
    Route(
        "GET",
        "/api/v1/prices",
        "listPrices",
        "Every model's price, and where it comes from.",
        {200: ([tv.Price], "By model.")},
    ),
    Route(
        "PUT",
        "/api/v1/prices/{model}",
        "setPrice",
        "Price a model, before server.yaml's prices; kept in the store, charged within a second.",
        {200: (tv.Price, "The model's price now."), 400: (views.Error, _BAD)},
        body=tv.PriceChange,
        parameters=(_MODEL,),
    ),
    Route(
        "DELETE",
        "/api/v1/prices/{model}",
        "clearPrice",
        "Forget the price set for a model; server.yaml's applies again.",
        {200: (tv.Price, "The model's price now."), 404: (views.Error, _MISSING)},
        parameters=(_MODEL,),
    ),
    Route(
        "GET",
        "/api/v1/usage",
        "usage",
        "What was used, added up by org, team, project, key or model; the store's totals to the token.",
        {200: ([tv.UsageRow], "A row per group, in order of id or name."), 400: (views.Error, _BAD)},
        parameters=(
            {
                "name": "by",
                "in": "query",
                "description": "How to add it up; empty or absent: by project.",
                "schema": {
                    "type": "string",
                    "enum": ["", "org", "team", "project", "key", "model"],
                    "default": "project",
                },
            },
            {
                "name": "since",
                "in": "query",
                "description": "The first day, YYYY-MM-DD (UTC); empty or absent: from the first.",
                "schema": {"type": "string", "pattern": r"^(\d{4}-\d{2}-\d{2})?$"},
            },
            {
                "name": "until",
                "in": "query",
                "description": "The last day, YYYY-MM-DD (UTC); empty or absent: to the last.",
                "schema": {"type": "string", "pattern": r"^(\d{4}-\d{2}-\d{2})?$"},
            },
        ),
    ),
)


def _schema(view: Any) -> dict[str, Any]:
    if isinstance(view, list):
        return {"type": "array", "items": ref(view[0])}
    return ref(view)


def paths() -> dict[str, Any]:
    """The OpenAPI path items of these routes (adminapi/openapi.py puts them in the document)."""
    items: dict[str, Any] = {}
    for route in ROUTES:
        operation: dict[str, Any] = {
            "operationId": route.operation,
            "summary": route.summary,
            "responses": {
                str(status): {"description": text, "content": {"application/json": {"schema": _schema(view)}}}
                for status, (view, text) in route.replies.items()
            },
        }
        if route.parameters:
            operation["parameters"] = list(route.parameters)
        if route.body is not None:
            # A body that is not JSON is refused before the route reads it; a field it does not take, 400.
            for status, text in (
                ("400", _BAD),
                ("415", "The body is not JSON (Content-Type: application/json)."),
            ):
                operation["responses"].setdefault(
                    status,
                    {"description": text, "content": {"application/json": {"schema": ref(views.Error)}}},
                )
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref(route.body)}},
            }
        items.setdefault(route.path, {})[route.method.lower()] = operation
    return items
