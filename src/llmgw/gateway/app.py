"""The client-facing aiohttp application: /health, /v1/models and the proxied routes of every API in
apis.py (OpenAI's chat and text completions, embeddings and Responses, Anthropic's Messages, rerank,
transcriptions), each going through the same pipeline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw import strictjson
from llmgw.bodies import decode_bodies
from llmgw.catalog import CATALOG_KEY, Catalog
from llmgw.config import ServerConfig
from llmgw.gateway import access
from llmgw.gateway.admission import Admission
from llmgw.gateway.apis import APIS, Api, ModelKind, paths_for, served_paths
from llmgw.gateway.auth import Authenticate, KeyCache
from llmgw.gateway.coldstart import ColdStarts
from llmgw.gateway.errors import LONG_LINE_CODES, ApiError, answer, route_errors
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.gateway.pipeline import Call, Handler, Stage, compose, endpoint, read_request
from llmgw.gateway.proxy import UPSTREAM_ERRORS_KEY, client_session, proxy
from llmgw.gateway.router import ReplicaTable, Router
from llmgw.slashes import plain_paths
from llmgw.store.keys import KeyRecord
from llmgw.store.scopes import Hierarchy

_NO_PROJECTS = Hierarchy({}, {}, {})
ROUTER_KEY = web.AppKey("llmgw.gateway.router", Router)
KEYS_KEY = web.AppKey("llmgw.gateway.keys", KeyCache)
COLD_STARTS_KEY = web.AppKey("llmgw.gateway.cold_starts", ColdStarts)

# Prompts with long contexts or images run to megabytes; aiohttp's default
# limit (1 MiB) would refuse them. A request is charged for at most a token per byte of it
# (admission), which is part of what keeps its cost finite (llmgw.maxima).
MAX_BODY = 64 * 1024 * 1024


def _model_entry(name: str) -> dict[str, object]:
    """A model as OpenAI's /v1/models lists it."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}


# Anthropic's clients send it on every request: /v1/models then answers in their shape.
_ANTHROPIC_VERSION = "anthropic-version"


def _anthropic(request: web.Request) -> bool:
    return _ANTHROPIC_VERSION in request.headers


def _anthropic_entry(name: str) -> dict[str, object]:
    """A model as Anthropic's /v1/models lists it (its clients read id and display_name)."""
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}


def _models_endpoint(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """/v1/models, answering and refusing in Anthropic's shape to Anthropic's clients, else OpenAI's."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(Call(request))
        except ApiError as err:
            return err.response("anthropic" if _anthropic(request) else "openai")

    return handle


def _guarded_app() -> web.Application:
    """The gateway's application with the shared guards every route goes through, before any handler."""
    return web.Application(
        client_max_size=MAX_BODY,
        middlewares=[
            route_errors(served_paths()),
            # /v1/models/ and /admin/ lead where /v1/models and /admin do (they were 404s); before the body is
            # read, which would keep it from redirecting.
            plain_paths,
            decode_bodies(
                lambda request, status, message: answer(
                    request, status, message, code=LONG_LINE_CODES.get(status, "invalid_body")
                ),
                MAX_BODY,
                raw_forms=frozenset(path for api in APIS if api.body == "multipart" for path in api.paths),
            ),
        ],
    )


def _models_a_key_may_call(admission: Admission | None) -> Callable[[list[str], KeyRecord], list[str]]:
    """Which models a key may call: its list within its project's, known to admission; without admission
    (a gateway with no limits) the key's own list alone."""
    if admission is not None:
        return admission.listed
    return lambda names, key: access.listed(names, key, _NO_PROJECTS)


def make_gateway_app(
    cfg: ServerConfig,
    catalog: Catalog,
    replicas: ReplicaTable,
    keys: KeyCache,
    admission: Admission | None = None,
    metrics: GatewayMetrics | None = None,
) -> web.Application:
    """The gateway for the catalog, routing to replicas, checking keys when cfg.auth.enabled.

    catalog is the server's live one (models added with ctl too), the one its admin API changes.
    admission (limits, budgets, usage) applies to calls with a key, so only when auth is enabled;
    metrics counts every completion request (in a registry no one reads, without one).
    """
    if metrics is None:
        metrics = GatewayMetrics(CollectorRegistry(), catalog)
    app = _guarded_app()
    app[ROUTER_KEY] = router = Router(catalog, replicas, cfg.router, metrics.in_flight)
    app[COLD_STARTS_KEY] = cold_starts = ColdStarts(catalog, replicas)
    app[CATALOG_KEY] = catalog
    app[KEYS_KEY] = keys
    app[UPSTREAM_ERRORS_KEY] = metrics.upstream_error
    app.cleanup_ctx.append(client_session)
    auth: list[Stage] = [Authenticate(keys)] if cfg.auth.enabled else []
    admit: list[Stage] = [admission] if admission is not None and cfg.auth.enabled else []
    # Refusals before admission are counted in the usage as admission's own are.
    counted: list[Stage] = [admission.count_refusals] if admission is not None and cfg.auth.enabled else []
    allowed_for = _models_a_key_may_call(admission)

    def route(api: Api) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """Every API's way through the gateway: the same stages, in the same order."""
        stages: list[Stage] = [
            metrics.observe,
            *auth,
            *counted,
            read_request,
            _serves(api.kind, catalog),
            *admit,
            cold_starts,
            router,
        ]
        return endpoint(compose(stages, proxy), api)

    # Built once per catalog change, not per request: (the catalog's generation, every model's entry).
    listed: list[tuple[int, dict[str, dict[str, object]]]] = []

    def entries() -> dict[str, dict[str, object]]:
        if not listed or listed[0][0] != catalog.generation:
            by_name = {name: _model_entry(name) for name in catalog.names()}
            listed[:] = [(catalog.generation, by_name)]
        return listed[0][1]

    async def list_models(call: Call) -> web.StreamResponse:
        by_name = entries()
        names = list(by_name)
        # Only what the key may call (its list, within its project's): a listed model is never a 403.
        shown = names if call.key is None else allowed_for(names, call.key)
        if _anthropic(call.request):
            data = [_anthropic_entry(name) for name in shown]
            return strictjson.response(
                {
                    "data": data,
                    "has_more": False,
                    "first_id": shown[0] if shown else None,
                    "last_id": shown[-1] if shown else None,
                }
            )
        return strictjson.response({"object": "list", "data": [by_name[name] for name in shown]})

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
        if call.key is not None:
            access.check(call.key, admission.hierarchy if admission is not None else _NO_PROJECTS, name)
        return strictjson.response(_anthropic_entry(name) if _anthropic(call.request) else entry)

    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models_endpoint(compose(auth, list_models)))
    # Model names may hold slashes (org/model), so the id is the whole rest of the path.
    app.router.add_get("/v1/models/{id:.+}", _models_endpoint(compose(auth, get_model)))
    app.router.add_route("*", "/v1/responses/{id}", _stored_response)
    app.router.add_route("*", "/v1/responses/{id}/{what}", _stored_response)
    for api in APIS:
        handler = route(api)
        for path in api.paths:
            app.router.add_post(path, handler)
    return app


async def _health(request: web.Request) -> web.StreamResponse:
    return strictjson.response({"status": "ok"})


async def _stored_response(request: web.Request) -> web.StreamResponse:
    """A stored response asked for by its id: the gateway cannot tell which engine holds one."""
    return ApiError(
        404,
        f"the gateway keeps no responses, and a request for {request.path} names no model to find the engine "
        "that may: send the whole conversation in `input` (POST /v1/responses) in place of "
        "previous_response_id",
        code="stored_responses_not_kept",
    ).response()


def _serves(kind: ModelKind, catalog: Catalog) -> Stage:
    """The stage that refuses, with 400 and before anything is reserved, a model of the other kind."""

    async def check(call: Call, rest: Handler) -> web.StreamResponse:
        definition = catalog.get(call.model)
        # A model the catalog does not have is the router's to refuse (404, naming those it has).
        if definition is not None and definition.kind != kind:
            others = [m.name for m in catalog.models() if m.kind == kind]
            instead = f"; the models that serve {kind} are {', '.join(others)}" if others else ""
            raise ApiError(
                400,
                f"{call.model} serves {definition.kind}, not {kind}: send it to {paths_for(definition.kind)}"
                + instead,
                code="wrong_model_kind",
                param="model",
            )
        return await rest(call)

    return check
