"""The admin API's handlers: what the control plane knows of nodes, models and replicas, and a node's logs.

Served on the admin listener (this machine only) and under /admin on the
client port for an administrator. Each route is declared once, in ROUTES at the
end: the listeners mount it (web/admin_listener.py, web/app.py) and the OpenAPI
document describes it (adminapi/openapi.py) from that one declaration. The
views come from the inventory through adminapi/projections.py, which the pages
render too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web

import llmgw
from llmgw import strictjson
from llmgw.adminapi import views
from llmgw.adminapi.engine_metrics import ScrapeError, scrape
from llmgw.adminapi.explain import explain_placement
from llmgw.adminapi.openapi import DOCUMENT_KEY, OPENAPI, document
from llmgw.adminapi.projections import (
    endpoints_view,
    failed_replicas_view,
    failures_view,
    fetch_log,
    model_view,
    node_view,
    parse_lines,
    replicas_view,
    status_view,
    why_not_ready,
)
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Body, Guard, Param, Reply, Route, mount
from llmgw.adminapi.scaling import scale_view
from llmgw.adminapi.weights import collect_weights, wanted_sources
from llmgw.bodies import MAX_ADMIN_BODY, BadJson, read_json, read_text
from llmgw.catalog import CATALOG_KEY, Catalog, DeclaredModel, UnknownModel, parse_model
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.config.yamltext import MAX_BYTES as MAX_YAML_BYTES
from llmgw.control.estimates import Needs
from llmgw.control.inventory import ADMIN_STATES, Inventory, Node
from llmgw.control.mirror import MIRROR_CLIENT_KEY, format_problem
from llmgw.control.nodelogs import ANSWER_TIMEOUT_S, DEFAULT_LINES, MAX_LINES
from llmgw.control.placement import Backoff
from llmgw.errors import ConfigError
from llmgw.gateway.endpoints import ENDPOINTS_KEY
from llmgw.pricing import price_of, unpriced_sentence
from llmgw.store.quotas import Budget

CONFIG_KEY = web.AppKey("llmgw.admin.config", ServerConfig)
INVENTORY_KEY = web.AppKey("llmgw.admin.inventory", Inventory)
# The reconciler's backoff, (model, node) -> why not now, when a reconciler runs (roles/server.py).
BACKOFF_KEY: web.AppKey[Callable[[], Mapping[tuple[str, str], Backoff]]] = web.AppKey("llmgw.admin.backoff")
# The reconciler's estimates from models' headers, (model, profile) -> need (control/estimates.py).
NEEDS_KEY: web.AppKey[Callable[[], Needs]] = web.AppKey("llmgw.admin.needs")
# The budgets the gateway enforces now, when the server runs one (roles/server.py): a model added
# with no price while any is set is said to escape them, in the answer to the one who added it.
BUDGETS_KEY: web.AppKey[Callable[[], Sequence[Budget]]] = web.AppKey("llmgw.admin.budgets")
# The prices set with `llmgw prices set`, as the gateway last loaded them: they count as prices.
# Leader or standby (control/ha/leadership.py), read on every status.
CONTROL_PLANE_KEY: web.AppKey[Callable[[], views.ControlPlane]] = web.AppKey("llmgw.admin.control_plane")
PRICES_KEY: web.AppKey[Callable[[], Mapping[str, PriceConfig]]] = web.AppKey("llmgw.admin.prices")


def unpriced(request: web.Request, model: ModelConfig) -> str | None:
    """That budgets never bind on model, while any is set and no price applies to it; else None."""
    budgets = request.config_dict.get(BUDGETS_KEY)
    if budgets is None or not budgets():
        return None
    prices = request.config_dict.get(PRICES_KEY)
    stored = prices() if prices is not None else None
    if price_of(request.config_dict[CONFIG_KEY], model.name, model, stored) is not None:
        return None
    return unpriced_sentence([model.name])


# --- handlers -------------------------------------------------------------------------------


def _known_node(request: web.Request) -> Node | web.Response:
    node_id = request.match_info["id"]
    node = request.config_dict[INVENTORY_KEY].node(node_id)
    if node is None:
        return error(404, f"no node {node_id} has registered")
    return node


async def get_status(request: web.Request) -> web.Response:
    models = request.config_dict[CATALOG_KEY].models()
    return reply(status_view(request.config_dict[INVENTORY_KEY], models, control_plane_view(request)))


def control_plane_view(request: web.Request) -> views.ControlPlane | None:
    """Leader or standby, as the server role says; None where no role said (an app built alone)."""
    said = request.config_dict.get(CONTROL_PLANE_KEY)
    return said() if said is not None else None


# Nodes per piece of GET /api/v1/nodes: a few milliseconds of the loop each.
NODES_PER_PIECE = 200


async def get_nodes(request: web.Request) -> web.StreamResponse:
    """The nodes' list, written a piece at a time with the loop given back between pieces.

    Built whole, thousands of nodes made megabytes of JSON in one go on the
    loop the gateway serves on (`ctl nodes` at 3,000 nodes held it for tenths
    of a second). The reply is the same list; each node's view is taken as its
    piece is written.
    """
    inventory = request.config_dict[INVENTORY_KEY]
    nodes = sorted(inventory.nodes(), key=lambda n: n.id)
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    await response.prepare(request)
    await response.write(b"[")
    for start in range(0, len(nodes), NODES_PER_PIECE):
        now = inventory.now()
        piece = [node_view(n, inventory, now) for n in nodes[start : start + NODES_PER_PIECE]]
        text = strictjson.dumps(views.CONVERTER.unstructure(piece))[1:-1]
        await response.write(((", " if start else "") + text).encode())
        await asyncio.sleep(0)
    await response.write(b"]")
    await response.write_eof()
    return response


async def get_node_logs(request: web.Request) -> web.Response:
    try:
        lines = parse_lines(request.query.get("lines"))
    except ValueError as exc:
        return error(400, str(exc))
    status, view = await fetch_log(
        request.config_dict[INVENTORY_KEY], request.match_info["id"], request.query.get("source", ""), lines
    )
    return reply(view, status)


async def set_node_state(request: web.Request) -> web.Response:
    # JSON only: a browser cannot send it cross-origin without asking first, so a page elsewhere
    # cannot cordon a node through the loopback listener of the administrator's own machine.
    if request.content_type != "application/json":
        return error(415, 'send the new state as JSON: {"state": "cordoned"}')
    node = _known_node(request)
    if isinstance(node, web.Response):
        return node
    try:
        body = await read_json(request, MAX_ADMIN_BODY)
    except BadJson as exc:
        said = "the body is not JSON" if exc.not_json else str(exc)
        return error(exc.status, f'{said}; send {{"state": "cordoned"}}')
    if not isinstance(body, dict) or set(body) - {"state"}:
        # A misspelt or extra field must not be read as "nothing else to change" and answered 200.
        return error(400, 'the body takes state alone: {"state": "cordoned"}')
    state = body.get("state")
    if state not in ADMIN_STATES:
        return error(400, f"state is {state!r}; expected one of {', '.join(ADMIN_STATES)}")
    inventory = request.config_dict[INVENTORY_KEY]
    inventory.set_admin_state(node.id, state)
    return reply(node_view(node, inventory))


def backoff_now(request: web.Request) -> Mapping[tuple[str, str], Backoff] | None:
    """The reconciler's backoff now, (model, node) -> why not there; None where this server places nothing."""
    backoff = request.config_dict.get(BACKOFF_KEY)
    return backoff() if backoff is not None else None


async def get_models(request: web.Request) -> web.Response:
    models = request.config_dict[CATALOG_KEY].models()
    inventory, endpoints = request.config_dict[INVENTORY_KEY], request.config_dict.get(ENDPOINTS_KEY)
    backoff = backoff_now(request)
    return reply(
        [
            model_view(m, inventory, unpriced(request, m), endpoints, backoff, scale_view(request, m))
            for m in models
        ]
    )


# JSON, or YAML under the names it goes by; none of them is one a page elsewhere may send without
# asking first (unlike text/plain or a form), which is what keeps such a page from adding models.
_DEFINITION_TYPES = ("application/json", "application/yaml", "application/x-yaml", "text/yaml")


async def post_model(request: web.Request) -> web.Response:
    """Add a model to the catalog, or replace one added before: its definition, YAML or JSON, is the body."""
    if request.content_type not in _DEFINITION_TYPES:
        return error(
            415,
            "send the model's definition as YAML (Content-Type: application/yaml) "
            "or JSON (Content-Type: application/json)",
        )
    # Named in errors: ctl sends the file's name, so a mistake reads "model.yaml:7: ...".
    source = request.query.get("file", "")[:200] or "the model definition"
    catalog, inventory = request.config_dict[CATALOG_KEY], request.config_dict[INVENTORY_KEY]
    # Said before the body is read: a definition is a screenful, and the client port would take 64 MiB.
    if request.content_length is not None and request.content_length > MAX_YAML_BYTES:
        return error(413, f"a model's definition is at most {MAX_YAML_BYTES:,} bytes")
    try:
        text = await read_text(request)
    except ValueError as exc:
        return error(400, str(exc))
    try:
        # Asked before the model is added: a format its engine cannot load would fail every replica.
        problem = await format_problem(
            request.config_dict.get(MIRROR_CLIENT_KEY), await asyncio.to_thread(parse_model, text, source)
        )
        if problem is not None:
            return error(400, f"{source}: {problem}")
        model, replaced = await catalog.add(text, source)
    except ConfigError as exc:
        return error(400, str(exc))
    except DeclaredModel as exc:
        return error(409, str(exc))
    endpoints = request.config_dict.get(ENDPOINTS_KEY)
    view = model_view(
        model,
        inventory,
        unpriced(request, model),
        endpoints,
        backoff_now(request),
        scale_view(request, model),
    )
    return reply(view, 200 if replaced else 201)


async def delete_model(request: web.Request) -> web.Response:
    """Remove a model added with ctl; the reconciler stops its replicas."""
    catalog = request.config_dict[CATALOG_KEY]
    name = request.match_info["name"]
    try:
        removed = await catalog.remove(name)
    except UnknownModel as exc:
        return error(404, str(exc))
    except DeclaredModel as exc:
        return error(409, str(exc))
    return reply(views.Removed(name=removed, removed=True))


async def get_replicas(request: web.Request) -> web.Response:
    inventory, model = request.config_dict[INVENTORY_KEY], request.query.get("model")
    everything = request.query.get("all", "")
    if everything not in ("", "0", "1", "true", "false"):
        return error(400, f"all is {everything!r}; expected 1 (also list replicas that failed lately) or 0")
    listed = replicas_view(inventory, model) + endpoints_view(request.config_dict.get(ENDPOINTS_KEY), model)
    if everything in ("1", "true"):
        listed += failed_replicas_view(inventory, model)
    return reply(listed)


async def get_replica_metrics(request: web.Request) -> web.Response:
    """The replica's engine's own metrics page, read now (adminapi/engine_metrics.py)."""
    shard_id = request.match_info["shard_id"]
    replica = next((r for r in request.config_dict[INVENTORY_KEY].replicas() if r.shard_id == shard_id), None)
    if replica is None:
        return error(404, f"there is no replica {shard_id}; `llmgw ctl replicas` lists them")
    try:
        got = await scrape(replica, secret=request.config_dict[INVENTORY_KEY].engine_secret(shard_id))
    except ScrapeError as exc:
        return error(502, str(exc))
    return reply(
        views.ReplicaMetrics(
            shard_id=replica.shard_id,
            model=replica.model,
            node=replica.node_id,
            engine=replica.engine,
            url=got.url,
            metrics=got.samples,
        )
    )


async def get_explain_placement(request: web.Request) -> web.Response:
    cfg, inventory = request.config_dict[CONFIG_KEY], request.config_dict[INVENTORY_KEY]
    name = request.query.get("model", "")
    if not name:
        return error(400, "say which model: /api/v1/explain-placement?model=NAME")
    catalog = request.config_dict[CATALOG_KEY]
    model = catalog.get(name)
    if model is None:
        known = ", ".join(catalog.names()) or "nothing"
        return error(404, f"no model {name} in the catalog; it has {known}")
    backoff = request.config_dict.get(BACKOFF_KEY)
    needs = request.config_dict.get(NEEDS_KEY)
    candidates = explain_placement(
        model, inventory, cfg, catalog.models(), backoff() if backoff else None, needs() if needs else None
    )
    return reply(
        views.Placement(
            model=name,
            candidates=candidates,
            why_not_ready=why_not_ready(inventory, name),
            failures=failures_view(inventory, name),
            scale=scale_view(request, model),
        )
    )


async def post_weights_collect(request: web.Request) -> web.Response:
    """Ask every node to remove the weights no catalog model uses (adminapi/weights.py)."""
    # JSON only, as set_node_state: a POST with no body is one a page elsewhere may send.
    if request.content_type != "application/json":
        return error(415, "send Content-Type: application/json (an empty object {} will do)")
    inventory = request.config_dict[INVENTORY_KEY]
    models = request.config_dict[CATALOG_KEY].models()
    done = await collect_weights(inventory, wanted_sources(inventory, models))
    return reply(views.Collected(nodes=done))


# --- the table --------------------------------------------------------------------------------

_ERROR = Reply("What went wrong, in a sentence.", views.Error)
_NODE_ID = Param("id", description="The node's id: its certificate's common name.")
_LINES = Param(
    "lines",
    "query",
    "How many of the newest lines.",
    {"type": "integer", "minimum": 1, "maximum": MAX_LINES, "default": DEFAULT_LINES},
)

ROUTES: tuple[Route, ...] = (
    Route(
        method="GET",
        path="/api/v1/status",
        handler=get_status,
        operation="status",
        summary="How many nodes, models and replicas, in which state.",
        replies={200: Reply("The cluster at a glance.", views.Status)},
    ),
    Route(
        method="GET",
        path="/api/v1/nodes",
        handler=get_nodes,
        operation="nodes",
        summary="Every node that registered since the control plane started.",
        replies={200: Reply("Nodes, by id.", views.Node, many=True)},
    ),
    Route(
        method="GET",
        path="/api/v1/nodes/{id}/logs",
        handler=get_node_logs,
        operation="nodeLogs",
        summary="The newest lines of one of a node's logs, asked of the node over its stream.",
        parameters=(
            _NODE_ID,
            Param(
                "source",
                "query",
                '"agent" (the default), or a shard id for that engine\'s output.',
                {"type": "string", "default": "agent"},
            ),
            _LINES,
        ),
        replies={
            200: Reply("The lines, oldest first, and the node's sources.", views.Logs),
            400: _ERROR,
            404: Reply("No such node, or no such source on it.", views.Logs),
            502: Reply("The node is not connected.", views.Logs),
            504: Reply(f"The node did not answer within {ANSWER_TIMEOUT_S:g} s.", views.Logs),
        },
    ),
    Route(
        method="POST",
        path="/api/v1/nodes/{id}/state",
        handler=set_node_state,
        operation="setNodeState",
        summary="Cordon or drain a node (no new replicas go there), or make it ready again.",
        parameters=(_NODE_ID,),
        body=Body(views.StateChange),
        replies={
            200: Reply("The node, in its new state.", views.Node),
            400: _ERROR,
            404: _ERROR,
            415: _ERROR,
        },
    ),
    Route(
        method="GET",
        path="/api/v1/models",
        handler=get_models,
        operation="models",
        summary="Every catalog model, its replicas, where they run and their state.",
        replies={200: Reply("The catalog.", views.Model, many=True)},
    ),
    Route(
        method="POST",
        path="/api/v1/models",
        handler=post_model,
        operation="addModel",
        summary="Add a model to the catalog, or replace one added before; kept over restarts.",
        description="The body is one model's definition, as under `models:` in server.yaml "
        "(docs/reference.md), YAML or JSON, at most 1 MiB (413). A name server.yaml declares is "
        "refused (409).",
        parameters=(Param("file", "query", "The definition's file name, which errors name with the line."),),
        body=Body(
            media={
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
            }
        ),
        replies={
            200: Reply("It replaced the model of that name added before.", views.Model),
            201: Reply("It was added.", views.Model),
            400: Reply("The definition cannot be used: what, at which line.", views.Error),
            409: _ERROR,
            413: Reply("The definition is over 1 MiB.", views.Error),
            415: _ERROR,
        },
    ),
    Route(
        method="DELETE",
        path="/api/v1/models/{name}",
        handler=delete_model,
        operation="removeModel",
        summary="Remove a model added with `llmgw ctl model add`; its replicas are stopped.",
        parameters=(
            Param(
                "name",
                description="The model's name, URL-encoded as one segment (org%2Fmodel); "
                "a bare slash is accepted too, except before bench (org%2Fbench).",
                # Model names may hold slashes (meta-llama/Llama-3.1-8B); a model's own routes
                # (adminapi/bench.py) are not one named "<model>/bench": OPTIONS and the 405s there
                # offered DELETE.
                pattern=".+(?<!/bench)",
            ),
        ),
        replies={
            200: Reply("It was removed.", views.Removed),
            404: _ERROR,
            409: Reply("server.yaml declares it; ctl removes only its own.", views.Error),
        },
    ),
    Route(
        method="GET",
        path="/api/v1/replicas",
        handler=get_replicas,
        operation="replicas",
        summary="Every replica, or those of one model.",
        parameters=(
            Param("model", "query"),
            Param(
                "all",
                "query",
                "1: also the replicas that failed lately and are gone, newest first.",
                {"type": "string", "enum": ["", "0", "1", "true", "false"]},
            ),
        ),
        replies={200: Reply("Replicas.", views.Replica, many=True), 400: _ERROR},
    ),
    Route(
        method="GET",
        path="/api/v1/replicas/{shard_id}/metrics",
        handler=get_replica_metrics,
        operation="replicaMetrics",
        summary="The replica's engine's own metrics page, read now and parsed into numbers.",
        parameters=(Param("shard_id", description="The replica, as `GET /api/v1/replicas` names it."),),
        replies={
            200: Reply("The engine's metrics.", views.ReplicaMetrics),
            404: _ERROR,
            502: Reply("The engine has no address yet or did not answer.", views.Error),
        },
    ),
    Route(
        method="GET",
        path="/api/v1/explain-placement",
        handler=get_explain_placement,
        operation="explainPlacement",
        summary="Per node, whether the model's next replica could go there, and why.",
        parameters=(Param("model", "query", schema={"type": "string", "minLength": 1}, required=True),),
        replies={200: Reply("One verdict per node.", views.Placement), 400: _ERROR, 404: _ERROR},
    ),
    Route(
        method="POST",
        path="/api/v1/weights/collect",
        handler=post_weights_collect,
        operation="collectWeights",
        summary="Ask every node to remove weights no catalog model uses, never any in use.",
        description="Send Content-Type: application/json (an empty object will do; the "
        "body is not read): without it a page elsewhere could make this change through a browser.",
        # Required: a POST with no body is one a page elsewhere may send without a preflight (415).
        body=Body(media={"application/json": {"schema": {"description": "Not read."}}}),
        replies={
            200: Reply("What each node was asked to remove, and what it keeps.", views.Collected),
            415: _ERROR,
        },
    ),
    OPENAPI,
)


def provide(app: web.Application, cfg: ServerConfig, inventory: Inventory, catalog: Catalog) -> None:
    """Put what the handlers read in app: server.yaml, the inventory and the live catalog.

    catalog is the server's live one, the one its gateway routes by: a model added here is served.
    """
    app[CONFIG_KEY] = cfg
    app[INVENTORY_KEY] = inventory
    app[CATALOG_KEY] = catalog


def install(
    app: web.Application,
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    *,
    prefix: str = "",
    guard: Guard | None = None,
) -> None:
    """An app of these routes alone, under prefix and each behind guard, with their own document.

    The listeners mount these routes among the rest of theirs (web/admin_listener.py, web/app.py).
    """
    provide(app, cfg, inventory, catalog)
    mount(app, ROUTES, prefix=prefix, guard=guard)
    app[DOCUMENT_KEY] = document(llmgw.__version__, ROUTES)
