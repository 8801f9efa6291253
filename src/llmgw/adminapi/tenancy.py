"""The admin API's tenancy routes: organisations, teams, projects, members, quotas and prices.

The same operations as `llmgw orgs|teams|projects|quotas|prices` (tenancy/operations.py), on the admin
listener and under /admin on the client port behind the same guard as the rest of the admin API.
Names are accepted wherever ids are. Changes are JSON bodies; what was changed is the reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

import attrs
from aiohttp import web

from llmgw.adminapi import views
from llmgw.adminapi.handlers import CONFIG_KEY
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Body, Guard, Handler, Param, Reply, Route, mount
from llmgw.adminapi.schema import named
from llmgw.bodies import MAX_ADMIN_BODY, BadJson, read_json
from llmgw.catalog import CATALOG_KEY
from llmgw.errors import LlmgwError
from llmgw.maxima import MAX_BUDGET, MAX_PER_MINUTE, MAX_PRICE_PER_1K, problem
from llmgw.store import Store
from llmgw.store.scopes import AmbiguousScope, Scope, ScopeInUse, UnknownScope
from llmgw.store.usage import USAGE_BY, UsageBy
from llmgw.tenancy import operations as tenancy
from llmgw.tenancy import views as tv

STORE_KEY = web.AppKey("llmgw.admin.store", Store)
# What the running gateway counts as spent of a scope's budget; absent without a gateway.
SPENT_KEY: web.AppKey[Callable[[Scope], float | None]] = web.AppKey("llmgw.admin.spent")

_LEVELS: dict[str, tenancy.Level] = {"orgs": "org", "teams": "team", "projects": "project"}
# What a team or a project is created in.
_PARENTS = {"teams": "org", "projects": "team"}


class BadQuery(Exception):
    """A body or query string that is not what the route takes, in a sentence; status 400, or 413."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _failed(exc: LlmgwError) -> web.Response:
    if isinstance(exc, UnknownScope):
        return error(404, str(exc))
    if isinstance(exc, (ScopeInUse, AmbiguousScope)):
        return error(409, str(exc))
    return error(400, str(exc))


# The body as read once by the route, before its handler: read_json's value.
_SENT = web.RequestKey("llmgw.admin.sent", object)


async def _body(request: web.Request, example: str) -> dict[str, Any]:
    body = request.get(_SENT)
    if isinstance(body, BadJson):
        said = "the body is not JSON" if body.not_json else str(body)
        raise BadQuery(f"{said}; send {example}", body.status)
    if not isinstance(body, dict):
        raise BadQuery(f"the body must be a JSON object: {example}")
    return body


async def _read_body(request: web.Request, fields: list[str]) -> None:
    """The body, read once with the shared reader and kept; BadQuery when the route does not take it."""
    try:
        sent = await read_json(request, MAX_ADMIN_BODY)
    except BadJson as exc:
        sent = exc  # the handler says what went wrong, with an example of its body
    request[_SENT] = sent
    # A misspelt field ("prompt_per_1K") must not be read as "left as it was" and answered 200.
    if isinstance(sent, dict):
        unknown = sorted(set(sent) - set(fields))
        if unknown:
            raise BadQuery(
                f"the body has {', '.join(repr(u) for u in unknown)}, which this route does not take; "
                f"it takes {', '.join(fields)}"
            )


def _text(body: dict[str, Any], name: str, example: str, required: bool = True) -> str:
    value = body.get(name, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise BadQuery(f"{name} must be a non-empty string: {example}")
    return value


def _number(body: dict[str, Any], name: str, kind: type, most: int, example: str) -> Any:
    """body[name]: KEEP when absent, None when null, else a number of kind from 0 to most."""
    if name not in body:
        return tenancy.KEEP
    value = body[name]
    if value is None:
        return None
    # 389.0 is an integer to JSON Schema, as the document says these are, and to most JSON writers.
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if (kind is int and not whole) or (kind is float and not (whole or isinstance(value, float))):
        raise BadQuery(f"{name} must be {'a whole number' if kind is int else 'a number'} or null: {example}")
    # 1e20 reached the store, a 500; JSON's 1e400 is read as inf.
    said = problem(name, value, most, whole=kind is int)
    if said is not None:
        raise BadQuery(said)
    return kind(value)


def _json_route(handler: Callable[[web.Request, Store], Any], body: type | None) -> Handler:
    """handler's view as the reply; a bad body a 400 (a field body does not have too), an error its status."""
    fields = sorted(a.name for a in attrs.fields(body)) if body is not None else []

    async def route(request: web.Request) -> web.StreamResponse:
        if body is not None and request.content_type != "application/json":
            # JSON only: a form a browser could send from another site must change nothing.
            return error(
                415, f"send the body as JSON (Content-Type: application/json) with {', '.join(fields)}"
            )
        try:
            if body is not None:
                await _read_body(request, fields)
            result = await handler(request, request.config_dict[STORE_KEY])
        except BadQuery as exc:
            return error(exc.status, str(exc))
        except LlmgwError as exc:
            return _failed(exc)
        if isinstance(result, tuple):
            return reply(*result)
        return reply(result)

    route.__name__ = getattr(handler, "__name__", "route")
    return route


# --- the hierarchy ----------------------------------------------------------------------------

_NAME = '{"name": "web", "parent": "core"}'


def _level(request: web.Request) -> tuple[str, tenancy.Level]:
    collection = request.path.rstrip("/").split("/api/v1/", 1)[1].split("/", 1)[0]
    return collection, _LEVELS[collection]


async def _list_level(request: web.Request, store: Store) -> Any:
    collection, kind = _level(request)
    parent = request.query.get(_PARENTS.get(collection, ""), "") or None
    return await tenancy.list_level(store, kind, parent)


async def _create_level(request: web.Request, store: Store) -> Any:
    collection, kind = _level(request)
    body = await _body(request, _NAME)
    name = _text(body, "name", _NAME)
    parent = _text(body, "parent", _NAME, required=collection in _PARENTS)
    return await tenancy.create(store, kind, name, parent), 201


async def _rename_level(request: web.Request, store: Store) -> Any:
    _, kind = _level(request)
    body = await _body(request, '{"name": "new name"}')
    # Not read, but a parent that is not even a string is a mistake the caller should hear of.
    _text(body, "parent", '{"name": "new name"}', required=False)
    return await tenancy.rename(
        store, kind, request.match_info["item"], _text(body, "name", '{"name": "new"}')
    )


async def _delete_level(request: web.Request, store: Store) -> Any:
    _, kind = _level(request)
    return await tenancy.delete(store, kind, request.match_info["item"])


_MODELS = '{"models": ["llama-3-8b"]} or {"models": null} for any model'


async def _set_models(request: web.Request, store: Store) -> Any:
    body = await _body(request, _MODELS)
    models = body.get("models", ...)
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        raise BadQuery(f"models must be a list of model names, or null: {_MODELS}")
    return await tenancy.set_models(store, request.match_info["item"], models)


# --- members ----------------------------------------------------------------------------------

_MEMBER = '{"user": "ana@example.com"}'


async def _members(request: web.Request, store: Store) -> Any:
    return await tenancy.members(store, request.match_info["item"])


async def _add_member(request: web.Request, store: Store) -> Any:
    body = await _body(request, _MEMBER)
    user = body.get("user")
    if isinstance(user, int) and not isinstance(user, bool):
        user = str(user)
    if not isinstance(user, str) or not user.strip():
        raise BadQuery(f"user must be the account's email or id: {_MEMBER}")
    return await tenancy.add_member(store, request.match_info["item"], user)


async def _remove_member(request: web.Request, store: Store) -> Any:
    return await tenancy.remove_member(store, request.match_info["item"], request.match_info["user"])


# --- quotas and prices ------------------------------------------------------------------------

_QUOTA = '{"rpm": 60, "tpm": 100000, "budget": 10, "period": "month"}'
_PRICE = '{"prompt_per_1k": 0.5, "completion_per_1k": 1.5}'


async def _quotas(request: web.Request, store: Store) -> Any:
    return await tenancy.quotas(store, request.config_dict.get(SPENT_KEY))


async def _set_quota(request: web.Request, store: Store) -> Any:
    body = await _body(request, _QUOTA)
    period = body.get("period")
    if period is not None and not isinstance(period, str):
        raise BadQuery(f"period must be day, week, month or total: {_QUOTA}")
    quota = await tenancy.set_quota(
        store,
        request.match_info["scope"],
        rpm=_number(body, "rpm", int, MAX_PER_MINUTE, _QUOTA),
        tpm=_number(body, "tpm", int, MAX_PER_MINUTE, _QUOTA),
        budget=_number(body, "budget", float, MAX_BUDGET, _QUOTA),
        period=period,
        spent=request.config_dict.get(SPENT_KEY),
    )
    if "budget" not in body and "period" not in body:
        return quota
    catalog = request.config_dict[CATALOG_KEY]
    return await tenancy.with_unpriced(store, request.config_dict[CONFIG_KEY], catalog.models(), quota)


async def _clear_quota(request: web.Request, store: Store) -> Any:
    return await tenancy.clear_quota(store, request.match_info["scope"])


async def _prices(request: web.Request, store: Store) -> Any:
    catalog = request.config_dict[CATALOG_KEY]
    return await tenancy.prices(store, request.config_dict[CONFIG_KEY], catalog.models())


async def _set_price(request: web.Request, store: Store) -> Any:
    body = await _body(request, _PRICE)
    prompt = _number(body, "prompt_per_1k", float, MAX_PRICE_PER_1K, _PRICE)
    completion = _number(body, "completion_per_1k", float, MAX_PRICE_PER_1K, _PRICE)
    if not isinstance(prompt, float) or not isinstance(completion, float):
        raise BadQuery(f"send both prices: {_PRICE}")
    models = request.config_dict[CATALOG_KEY].models()
    cfg = request.config_dict[CONFIG_KEY]
    return await tenancy.set_price(store, cfg, models, request.match_info["model"], prompt, completion)


async def _clear_price(request: web.Request, store: Store) -> Any:
    models = request.config_dict[CATALOG_KEY].models()
    cfg = request.config_dict[CONFIG_KEY]
    return await tenancy.clear_price(store, cfg, models, request.match_info["model"])


def usage_query(query: Mapping[str, str]) -> tuple[UsageBy, date | None, date | None]:
    """by, since and until from a query string, or BadQuery saying which is wrong."""
    by = query.get("by", "") or "project"
    if by not in USAGE_BY:
        raise BadQuery(f"by is '{by}'; it is one of {', '.join(USAGE_BY)}")
    days: list[date | None] = []
    for name in ("since", "until"):
        text = query.get(name, "")
        try:
            days.append(date.fromisoformat(text) if text else None)
        except ValueError:
            raise BadQuery(f"{name} is '{text}'; write a day as YYYY-MM-DD") from None
    return by, days[0], days[1]


async def _usage(request: web.Request, store: Store) -> Any:
    return await tenancy.usage(store, *usage_query(request.query))


# --- the table --------------------------------------------------------------------------------

_BAD = Reply("What is wrong with the request, in a sentence.", views.Error)
_MISSING = Reply("Something it names does not exist.", views.Error)
_TAKEN = Reply(
    "The name is taken, something still belongs to it, or several have a name it gives (give the id).",
    views.Error,
)
# Every route that finds a team or project by its name: several may have it (an org's is unique).
_AMBIGUOUS = {409: Reply("Several have a name it gives: give the id of one.", views.Error)}
_ITEM = {
    "orgs": Param("item", description="The organisation's id or name."),
    "teams": Param("item", description="The team's id or name."),
    "projects": Param("item", description="The project's id or name."),
}
_SCOPE = Param(
    "scope",
    description="org:NAME, team:NAME, project:NAME (an id works for a name) or key:PREFIX.",
    # A name of white space alone (\x1f is white space to Python) is no name: a 400 the pattern keeps out.
    schema={"type": "string", "pattern": r"^(org|team|project|key):\s*\S"},
)
# Model names may hold slashes (meta-llama/Llama-3.1-8B).
_MODEL = Param(
    "model",
    description="The model's name; it may hold slashes.",
    schema=named("ModelName"),
    pattern=r"[\s\S]+",
)
# A day date.fromisoformat reads, or nothing: "2024-02-30" matched \d{4}-\d{2}-\d{2} and was a 400
# the document did not foresee. Years 0001 to 9999; 29 February in leap years alone.
_YEAR = "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DAY_PATTERN = (
    f"^({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    f"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)?$"
)
_DAY = {"type": "string", "pattern": _DAY_PATTERN}


def _route(
    method: str,
    path: str,
    handler: Callable[[web.Request, Store], Any],
    operation: str,
    summary: str,
    replies: dict[int, Reply],
    *,
    body: type | None = None,
    parameters: tuple[Param, ...] = (),
) -> Route:
    """A route whose handler answers with a view from the store, a body (when it takes one) a JSON body."""
    return Route(
        method=method,
        path=path,
        handler=_json_route(handler, body),
        operation=operation,
        summary=summary,
        replies=replies,
        body=Body(body) if body is not None else None,
        parameters=parameters,
    )


def _level_routes(collection: str, view: type, what: str) -> tuple[Route, ...]:
    parent = _PARENTS.get(collection)
    query = (Param(parent, "query", f"Only those of this {parent} (id or name)."),) if parent else ()
    base = f"/api/v1/{collection}"
    # Only a team or a project names something else (its parent) that may not exist.
    missing = {404: _MISSING} if parent else {}
    item = (_ITEM[collection],)
    lower = what.lower()
    return (
        _route(
            "GET",
            base,
            _list_level,
            f"list{what}s",
            f"Every {lower}.",
            {
                200: Reply(f"The {lower}s.", view, many=True),
                **missing,
                **(_AMBIGUOUS if parent == "team" else {}),
            },
            parameters=query,
        ),
        _route(
            "POST",
            base,
            _create_level,
            f"create{what}",
            f"Create a {lower}.",
            {201: Reply("It was created.", view), 400: _BAD, **missing, 409: _TAKEN},
            body=tv.NewChild if parent else tv.NameChange,
        ),
        _route(
            "PATCH",
            base + "/{item}",
            _rename_level,
            f"rename{what}",
            f"Rename a {lower}.",
            {200: Reply("Renamed.", view), 400: _BAD, 404: _MISSING, 409: _TAKEN},
            body=tv.NameChange,
            parameters=item,
        ),
        _route(
            "DELETE",
            base + "/{item}",
            _delete_level,
            f"delete{what}",
            f"Delete a {lower} that holds nothing any more, with its limits and budget.",
            {200: Reply("Deleted.", tv.Deleted), 404: _MISSING, 409: _TAKEN},
            parameters=item,
        ),
    )


_MEMBERS = "/api/v1/projects/{item}/members"
_PROJECT = (_ITEM["projects"],)

ROUTES: tuple[Route, ...] = (
    *_level_routes("orgs", tv.Org, "Org"),
    *_level_routes("teams", tv.Team, "Team"),
    *_level_routes("projects", tv.Project, "Project"),
    _route(
        "PUT",
        "/api/v1/projects/{item}/models",
        _set_models,
        "setProjectModels",
        "Limit a project's keys to some models (null: any); each key's own list applies too.",
        {200: Reply("The project.", tv.Project), 400: _BAD, 404: _MISSING, **_AMBIGUOUS},
        body=tv.ModelsChange,
        parameters=_PROJECT,
    ),
    _route(
        "GET",
        _MEMBERS,
        _members,
        "listMembers",
        "The accounts in a project.",
        {200: Reply("Its members.", tv.Member, many=True), 404: _MISSING, **_AMBIGUOUS},
        parameters=_PROJECT,
    ),
    _route(
        "POST",
        _MEMBERS,
        _add_member,
        "addMember",
        "Put an account in the project (out of any other); a pending one is approved.",
        {200: Reply("The account.", tv.Member), 400: _BAD, 404: _MISSING, **_AMBIGUOUS},
        body=tv.MemberChange,
        parameters=_PROJECT,
    ),
    _route(
        "DELETE",
        _MEMBERS + "/{user}",
        _remove_member,
        "removeMember",
        "Take an account out of the project; it can create no keys until it joins another.",
        {200: Reply("The account.", tv.Member), 400: _BAD, 404: _MISSING, **_AMBIGUOUS},
        parameters=(*_PROJECT, Param("user", description="The account's id or email.")),
    ),
    _route(
        "GET",
        "/api/v1/quotas",
        _quotas,
        "listQuotas",
        "Every scope with a limit or a budget.",
        {200: Reply("Orgs, teams, projects, then keys.", tv.Quota, many=True)},
    ),
    _route(
        "PUT",
        "/api/v1/quotas/{scope}",
        _set_quota,
        "setQuota",
        "Change a scope's limits and budget: a field left out stays, null clears it; binds within a second.",
        {200: Reply("The scope's quota now.", tv.Quota), 400: _BAD, 404: _MISSING, **_AMBIGUOUS},
        body=tv.QuotaChange,
        parameters=(_SCOPE,),
    ),
    _route(
        "DELETE",
        "/api/v1/quotas/{scope}",
        _clear_quota,
        "clearQuota",
        "Remove a scope's limits and budget.",
        {200: Reply("The scope's quota now: none.", tv.Quota), 400: _BAD, 404: _MISSING, **_AMBIGUOUS},
        parameters=(_SCOPE,),
    ),
    _route(
        "GET",
        "/api/v1/prices",
        _prices,
        "listPrices",
        "Every model's price, and where it comes from.",
        {200: Reply("By model.", tv.Price, many=True)},
    ),
    _route(
        "PUT",
        "/api/v1/prices/{model}",
        _set_price,
        "setPrice",
        "Price a model, before server.yaml's prices; kept in the store, charged within a second.",
        {200: Reply("The model's price now.", tv.Price), 400: _BAD},
        body=tv.PriceChange,
        parameters=(_MODEL,),
    ),
    _route(
        "DELETE",
        "/api/v1/prices/{model}",
        _clear_price,
        "clearPrice",
        "Forget the price set for a model; server.yaml's applies again.",
        {200: Reply("The model's price now.", tv.Price), 404: _MISSING},
        parameters=(_MODEL,),
    ),
    _route(
        "GET",
        "/api/v1/usage",
        _usage,
        "usage",
        "What was used, added up by org, team, project, key or model; the store's totals to the token.",
        {200: Reply("A row per group, in order of id or name.", tv.UsageRow, many=True), 400: _BAD},
        parameters=(
            Param(
                "by",
                "query",
                "How to add it up; empty or absent: by project.",
                {
                    "type": "string",
                    "enum": ["", "org", "team", "project", "key", "model"],
                    "default": "project",
                },
            ),
            Param(
                "since", "query", "The first day, YYYY-MM-DD (UTC); empty or absent: from the first.", _DAY
            ),
            Param("until", "query", "The last day, YYYY-MM-DD (UTC); empty or absent: to the last.", _DAY),
        ),
    ),
)


def provide(app: web.Application, store: Store, spent: Callable[[Scope], float | None] | None) -> None:
    """What these routes read: the store, and what the gateway counts as spent (None: no gateway)."""
    app[STORE_KEY] = store
    if spent is not None:
        app[SPENT_KEY] = spent


def install(
    app: web.Application,
    store: Store,
    spent: Callable[[Scope], float | None] | None,
    *,
    prefix: str = "",
    guard: Guard | None = None,
) -> None:
    """Add these routes alone under prefix to app, each behind guard (after adminapi.handlers.install).

    The listeners mount them among the rest of theirs (web/admin_listener.py, web/app.py).
    """
    provide(app, store, spent)
    mount(app, ROUTES, prefix=prefix, guard=guard)
