"""The admin API's tenancy routes: organisations, teams, projects, members, quotas and prices.

The same operations as `llmgw orgs|teams|projects|quotas|prices` (tenancy/operations.py), on the admin
listener and under /admin on the client port behind the same guard as the rest of the admin API.
Names are accepted wherever ids are. Changes are JSON bodies; what was changed is the reply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

import attrs
from aiohttp import web

from llmgw.adminapi import tenancy_doc
from llmgw.adminapi.handlers import CONFIG_KEY, Handler, error, reply
from llmgw.catalog import CATALOG_KEY
from llmgw.errors import LlmgwError
from llmgw.store import Store
from llmgw.store.scopes import Scope, ScopeInUse, UnknownScope
from llmgw.store.usage import USAGE_BY, UsageBy
from llmgw.tenancy import operations as tenancy

STORE_KEY = web.AppKey("llmgw.admin.store", Store)
# What the running gateway counts as spent of a scope's budget; absent without a gateway.
SPENT_KEY: web.AppKey[Callable[[Scope], float | None]] = web.AppKey("llmgw.admin.spent")

_LEVELS: dict[str, tenancy.Level] = {"orgs": "org", "teams": "team", "projects": "project"}


class BadQuery(Exception):
    """A body or query string that is not what the route takes, in a sentence."""


def _failed(exc: LlmgwError) -> web.Response:
    if isinstance(exc, UnknownScope):
        return error(404, str(exc))
    if isinstance(exc, ScopeInUse):
        return error(409, str(exc))
    return error(400, str(exc))


async def _body(request: web.Request, example: str) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadQuery(f"the body is not JSON; send {example}") from None
    if not isinstance(body, dict):
        raise BadQuery(f"the body must be a JSON object: {example}")
    return body


async def _no_unknown_fields(request: web.Request, fields: list[str]) -> None:
    # A misspelt field ("prompt_per_1K") must not be read as "left as it was" and answered 200.
    try:
        sent = await request.json()
    except ValueError:
        return  # the handler says what a body must be
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


def _number(body: dict[str, Any], name: str, kind: type, example: str) -> Any:
    """body[name]: KEEP when absent, None when null, else a number of kind (0 or more)."""
    if name not in body:
        return tenancy.KEEP
    value = body[name]
    if value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if (kind is int and not whole) or (kind is float and not (whole or isinstance(value, float))):
        raise BadQuery(f"{name} must be {'a whole number' if kind is int else 'a number'} or null: {example}")
    if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
        raise BadQuery(f"{name} is {value}; it must be 0 or more")
    return kind(value)


def _json_route(handler: Callable[[web.Request, Store], Any], body: type | None = None) -> Handler:
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
                await _no_unknown_fields(request, fields)
            result = await handler(request, request.config_dict[STORE_KEY])
        except BadQuery as exc:
            return error(400, str(exc))
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
    parent = request.query.get(tenancy_doc.PARENTS.get(collection, ""), "") or None
    return await tenancy.list_level(store, kind, parent)


async def _create_level(request: web.Request, store: Store) -> Any:
    collection, kind = _level(request)
    body = await _body(request, _NAME)
    name = _text(body, "name", _NAME)
    parent = _text(body, "parent", _NAME, required=collection in tenancy_doc.PARENTS)
    return await tenancy.create(store, kind, name, parent), 201


async def _rename_level(request: web.Request, store: Store) -> Any:
    _, kind = _level(request)
    body = await _body(request, '{"name": "new name"}')
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
        rpm=_number(body, "rpm", int, _QUOTA),
        tpm=_number(body, "tpm", int, _QUOTA),
        budget=_number(body, "budget", float, _QUOTA),
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
    prompt = _number(body, "prompt_per_1k", float, _PRICE)
    completion = _number(body, "completion_per_1k", float, _PRICE)
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


# --- routes ---------------------------------------------------------------------------------

# The handler of each route tenancy_doc.ROUTES describes, by method and path.
HANDLERS: dict[tuple[str, str], Callable[[web.Request, Store], Any]] = {
    **{
        (method, f"/api/v1/{collection}{tail}"): handler
        for collection in ("orgs", "teams", "projects")
        for method, tail, handler in (
            ("GET", "", _list_level),
            ("POST", "", _create_level),
            ("PATCH", "/{item}", _rename_level),
            ("DELETE", "/{item}", _delete_level),
        )
    },
    ("PUT", "/api/v1/projects/{item}/models"): _set_models,
    ("GET", "/api/v1/projects/{item}/members"): _members,
    ("POST", "/api/v1/projects/{item}/members"): _add_member,
    ("DELETE", "/api/v1/projects/{item}/members/{user}"): _remove_member,
    ("GET", "/api/v1/quotas"): _quotas,
    ("PUT", "/api/v1/quotas/{scope}"): _set_quota,
    ("DELETE", "/api/v1/quotas/{scope}"): _clear_quota,
    ("GET", "/api/v1/prices"): _prices,
    ("PUT", "/api/v1/prices/{model}"): _set_price,
    ("DELETE", "/api/v1/prices/{model}"): _clear_price,
    ("GET", "/api/v1/usage"): _usage,
}
ROUTES = tenancy_doc.ROUTES


def install(
    app: web.Application,
    store: Store,
    spent: Callable[[Scope], float | None] | None,
    *,
    prefix: str = "",
    guard: Callable[[Handler], Handler] | None = None,
) -> None:
    """Add the tenancy routes under prefix to app, each wrapped in guard (after adminapi.install)."""
    app[STORE_KEY] = store
    if spent is not None:
        app[SPENT_KEY] = spent
    for route in ROUTES:
        # Model names may hold slashes (meta-llama/Llama-3.1-8B).
        path = route.path.replace("{model}", r"{model:[\s\S]+}")
        handler = _json_route(HANDLERS[(route.method, route.path)], route.body)
        app.router.add_route(route.method, prefix + path, guard(handler) if guard else handler)
