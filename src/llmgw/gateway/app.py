"""The client-facing aiohttp application: /health, /v1/models and the proxied OpenAI routes."""

from __future__ import annotations

import json

from aiohttp import web

from llmgw.bodies import decode_bodies
from llmgw.catalog import CATALOG_KEY, Catalog
from llmgw.config import ServerConfig
from llmgw.gateway.admission import Admission
from llmgw.gateway.auth import Authenticate, KeyCache
from llmgw.gateway.errors import answer, openai_errors
from llmgw.gateway.pipeline import Call, Stage, compose, endpoint, read_request
from llmgw.gateway.proxy import client_session, proxy
from llmgw.gateway.router import ReplicaTable, Router

ROUTER_KEY = web.AppKey("llmgw.gateway.router", Router)
KEYS_KEY = web.AppKey("llmgw.gateway.keys", KeyCache)

# Prompts with long contexts or images run to megabytes; aiohttp's default
# limit (1 MiB) would refuse them.
_MAX_BODY = 64 * 1024 * 1024


def make_gateway_app(
    cfg: ServerConfig,
    catalog: Catalog,
    replicas: ReplicaTable,
    keys: KeyCache,
    admission: Admission | None = None,
) -> web.Application:
    """The gateway for the catalog, routing to replicas, checking keys when cfg.auth.enabled.

    catalog is the server's live one (models added with ctl too), the one its admin API changes.
    admission (limits, budgets, usage) applies to calls with a key, so only when auth is enabled.
    """
    app = web.Application(
        client_max_size=_MAX_BODY,
        middlewares=[
            openai_errors,
            # /v1/models/ and /admin/ lead where /v1/models and /admin do (they were 404s); before the body is
            # read, which would keep it from redirecting.
            web.normalize_path_middleware(append_slash=False, remove_slash=True),
            decode_bodies(
                lambda request, status, message: answer(request, status, message, code="invalid_body"),
                _MAX_BODY,
            ),
        ],
    )
    router = Router(catalog, replicas)
    app[ROUTER_KEY] = router
    app[CATALOG_KEY] = catalog
    app[KEYS_KEY] = keys
    app.cleanup_ctx.append(client_session)

    auth: list[Stage] = [Authenticate(keys)] if cfg.auth.enabled else []
    admit: list[Stage] = [admission] if admission is not None and cfg.auth.enabled else []
    completions = endpoint(compose([*auth, read_request, *admit, router], proxy))
    # Built once per catalog change, not per request: (the catalog's generation, the body).
    listed: list[tuple[int, bytes]] = []

    async def list_models(call: Call) -> web.StreamResponse:
        if not listed or listed[0][0] != catalog.generation:
            body = json.dumps(
                {
                    "object": "list",
                    "data": [
                        {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}
                        for name in catalog.names()
                    ],
                }
            ).encode()
            listed[:] = [(catalog.generation, body)]
        return web.Response(body=listed[0][1], content_type="application/json")

    async def health(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", endpoint(compose(auth, list_models)))
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    return app
