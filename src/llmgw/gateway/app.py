"""The client-facing aiohttp application: /health, /v1/models and the proxied OpenAI routes."""

from __future__ import annotations

from aiohttp import web

from llmgw.catalog import CATALOG_KEY, Catalog
from llmgw.config import ServerConfig
from llmgw.gateway import access
from llmgw.gateway.admission import Admission
from llmgw.gateway.auth import Authenticate, KeyCache
from llmgw.gateway.errors import ApiError, openai_errors
from llmgw.gateway.pipeline import Call, Stage, compose, endpoint, read_request
from llmgw.gateway.proxy import client_session, proxy
from llmgw.gateway.router import ReplicaTable, Router

ROUTER_KEY = web.AppKey("llmgw.gateway.router", Router)
KEYS_KEY = web.AppKey("llmgw.gateway.keys", KeyCache)

# Prompts with long contexts or images run to megabytes; aiohttp's default
# limit (1 MiB) would refuse them.
_MAX_BODY = 64 * 1024 * 1024


def _model_entry(name: str) -> dict[str, object]:
    """A model as OpenAI's /v1/models lists it."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}


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
    app = web.Application(client_max_size=_MAX_BODY, middlewares=[openai_errors])
    router = Router(catalog, replicas)
    app[ROUTER_KEY] = router
    app[CATALOG_KEY] = catalog
    app[KEYS_KEY] = keys
    app.cleanup_ctx.append(client_session)

    auth: list[Stage] = [Authenticate(keys)] if cfg.auth.enabled else []
    admit: list[Stage] = [admission] if admission is not None and cfg.auth.enabled else []
    completions = endpoint(compose([*auth, read_request, *admit, router], proxy))
    # Built once per catalog change, not per request: (the catalog's generation, every model's entry).
    listed: list[tuple[int, dict[str, dict[str, object]]]] = []

    def entries() -> dict[str, dict[str, object]]:
        if not listed or listed[0][0] != catalog.generation:
            by_name = {name: _model_entry(name) for name in catalog.names()}
            listed[:] = [(catalog.generation, by_name)]
        return listed[0][1]

    async def list_models(call: Call) -> web.StreamResponse:
        # Only what the key may call: a client picking from the list must not pick a 403.
        data = [entry for name, entry in entries().items() if access.may_call(call.key, name)]
        return web.json_response({"object": "list", "data": data})

    async def get_model(call: Call) -> web.StreamResponse:
        # The openai client's models.retrieve(); the id is one path segment, org%2Fmodel for org/model,
        # or org/model itself, as the client sends it.
        name = call.request.match_info["id"]
        entry = entries().get(name)
        if entry is None:
            raise ApiError(
                404,
                f"the model '{name}' does not exist here; GET /v1/models lists the models this key may use",
                code="model_not_found",
                param="model",
            )
        access.check(call.key, name)
        return web.json_response(entry)

    async def health(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", endpoint(compose(auth, list_models)))
    # Model names may hold slashes (org/model), so the id is the whole rest of the path.
    app.router.add_get("/v1/models/{id:.+}", endpoint(compose(auth, get_model)))
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    return app
