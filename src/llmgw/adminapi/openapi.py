"""The OpenAPI 3.1 document of the admin API, served at /api/v1/openapi.json.

Nothing here is written per route: the paths come from the listener's route
table (adminapi/routes.py), the schemas from the views the handlers return
(adminapi/views.py, adminapi/schema.py). Tests hold that every route the admin
listener serves is in the document and that every reply validates against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from llmgw import strictjson
from llmgw.adminapi import views
from llmgw.adminapi.routes import Reply, Route
from llmgw.adminapi.schema import components, ref
from llmgw.bench import result as bench_result
from llmgw.capacity import fleet as capacity
from llmgw.mirror import admin as mirror_admin
from llmgw.tenancy import views as tenancy_views

# The document of the listener the app is, made from its table when the table is mounted.
DOCUMENT_KEY: web.AppKey[dict[str, Any]] = web.AppKey("llmgw.admin.openapi", dict)

# A body that is not JSON is refused before the route reads it; a field its view does not have, 400;
# one past the admin API's limit (bodies.MAX_ADMIN_BODY), 413.
_BODY_REFUSALS = {
    400: Reply("What is wrong with the request, in a sentence.", views.Error),
    413: Reply("The body is more than 1 MiB, the most the admin API takes.", views.Error),
    415: Reply("The body is not JSON (Content-Type: application/json).", views.Error),
}


async def get_openapi(request: web.Request) -> web.Response:
    return strictjson.response(request.config_dict[DOCUMENT_KEY])


OPENAPI = Route(
    method="GET",
    path="/api/v1/openapi.json",
    handler=get_openapi,
    operation="openapi",
    summary="This document.",
    replies={200: Reply("The OpenAPI document.")},
)


def document(version: str, routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI document of a listener whose table is routes."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llmgw admin API",
            "version": version,
            "description": "Served on the admin listener (`admin_listen`, this machine only) and under "
            "/admin on the client port, where it needs an admin token (`admin_tokens`) or session.",
        },
        "components": {
            "schemas": components(
                (
                    *views.SHAPES,
                    *capacity.SHAPES,
                    *bench_result.SHAPES,
                    *tenancy_views.SHAPES,
                    *mirror_admin.SHAPES,
                )
            ),
            "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
        },
        "paths": paths(routes),
    }


def paths(routes: Iterable[Route]) -> dict[str, Any]:
    """The document's path items: one operation per route that has an operationId."""
    items: dict[str, Any] = {}
    for route in routes:
        if route.operation is not None:
            items.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return items


def _operation(route: Route) -> dict[str, Any]:
    replies = dict(route.replies)
    operation: dict[str, Any] = {"operationId": route.operation, "summary": route.summary}
    if route.description:
        operation["description"] = route.description
    if any(r.html for r in replies.values()):
        operation["tags"] = ["pages"]
    if route.parameters:
        operation["parameters"] = [p.openapi() for p in route.parameters]
    if route.body is not None:
        media = dict(route.body.media)
        if route.body.view is not None:
            media["application/json"] = {"schema": ref(route.body.view)}
            replies = {**_BODY_REFUSALS, **replies}
        operation["requestBody"] = {"required": route.body.required, "content": media}
    operation["responses"] = {str(status): _response(replies[status]) for status in sorted(replies)}
    return operation


def _response(reply: Reply) -> dict[str, Any]:
    if reply.html:
        return {"description": reply.text, "content": {"text/html": {"schema": {"type": "string"}}}}
    if reply.view is None:
        return {"description": reply.text}
    schema = {"type": "array", "items": ref(reply.view)} if reply.many else ref(reply.view)
    return {"description": reply.text, "content": {"application/json": {"schema": schema}}}
