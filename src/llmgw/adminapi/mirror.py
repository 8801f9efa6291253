"""The mirror's admin API as the control plane relays it (control/mirror.py), for `llmgw ctl mirror`.

Each route answers 404 where server.yaml names no mirror and 502 where the mirror cannot be reached.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.adminapi import views
from llmgw.adminapi.routes import Body, Guard, Param, Reply, Route, mount
from llmgw.control.mirror import MIRROR_CLIENT_KEY, MirrorClient, relay
from llmgw.mirror import admin as mirror_admin

_RELAYED = "Relayed to the mirror's admin listener; 404 where server.yaml names no mirror, 502 where it "
_GONE = Reply("No mirror is configured (or, for one fetch or model, no such one).", views.Error)
_UNREACHABLE = Reply("The mirror cannot be reached.", views.Error)
_ERROR = Reply("What went wrong, in a sentence.", views.Error)


# What the mirror reads of a fetch (mirror/admin.py); the rest of the body it does not read.
_FETCH = {
    "type": "object",
    "required": ["model"],
    "properties": {
        "model": {"type": "string", "description": "REPO[@REVISION]."},
        "include": {"type": "array", "items": {"type": "string", "minLength": 1}},
    },
}


def _summary(what: str) -> str:
    return what + " " + _RELAYED + "cannot be reached."


ROUTES: tuple[Route, ...] = (
    Route(
        method="GET",
        path="/api/v1/mirror/models",
        handler=relay(lambda _: "/api/v1/models"),
        operation="mirrorModels",
        summary=_summary("The models on the mirror, their files, sizes and pins."),
        replies={200: Reply("The models.", mirror_admin.MirrorModels), 404: _GONE, 502: _UNREACHABLE},
    ),
    Route(
        method="DELETE",
        path="/api/v1/mirror/models",
        handler=relay(lambda _: "/api/v1/models"),
        operation="mirrorRemoveModel",
        summary=_summary("Delete a model from the mirror."),
        parameters=(
            Param(
                "model",
                "query",
                "REPO@REVISION: a commit, or the revision the model was fetched as.",
                required=True,
            ),
        ),
        replies={
            200: Reply("What was deleted.", mirror_admin.MirrorRemoved),
            400: _ERROR,
            404: _GONE,
            409: Reply("The model is being fetched.", views.Error),
            502: _UNREACHABLE,
        },
    ),
    Route(
        method="GET",
        path="/api/v1/mirror/fetches",
        handler=relay(lambda _: "/api/v1/fetches"),
        operation="mirrorFetches",
        summary=_summary("The mirror's fetches, newest first."),
        replies={200: Reply("The fetches.", mirror_admin.MirrorFetches), 404: _GONE, 502: _UNREACHABLE},
    ),
    Route(
        method="POST",
        path="/api/v1/mirror/fetches",
        handler=relay(lambda _: "/api/v1/fetches"),
        operation="mirrorFetch",
        summary=_summary('Start a fetch: {"model": "REPO[@REVISION]", "include": ["GLOB"]}.'),
        body=Body(media={"application/json": {"schema": _FETCH}}),
        replies={
            202: Reply("The fetch, running.", mirror_admin.Fetch),
            400: _ERROR,
            404: _GONE,
            415: Reply("The body is not JSON (Content-Type: application/json).", views.Error),
            502: _UNREACHABLE,
        },
    ),
    Route(
        method="GET",
        path="/api/v1/mirror/fetches/{id}",
        handler=relay(lambda r: f"/api/v1/fetches/{r.match_info['id']}"),
        operation="mirrorFetchProgress",
        summary=_summary("One fetch: its state, progress, error or model."),
        parameters=(Param("id", description="The fetch's id."),),
        replies={200: Reply("The fetch.", mirror_admin.Fetch), 404: _GONE, 502: _UNREACHABLE},
    ),
)


def provide(app: web.Application, client: MirrorClient | None) -> None:
    """Put the mirror's client in app; None: no mirror is configured, and the routes say so."""
    app[MIRROR_CLIENT_KEY] = client


def install(
    app: web.Application, client: MirrorClient | None, *, prefix: str = "", guard: Guard | None = None
) -> None:
    """Add the relay's routes alone under prefix to app, each behind guard."""
    provide(app, client)
    mount(app, ROUTES, prefix=prefix, guard=guard)
