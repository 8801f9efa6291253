"""The admin API: what the control plane knows of nodes, models and replicas, and a node's logs.

Served on the admin listener (this machine only) and under /admin on the
client port for an administrator. The functions here build the API's views
(adminapi/views.py) from the inventory, and the admin pages render the very same
ones, so `llmgw ctl nodes` and the cluster page can never disagree about a node.

Data other parts of llmgw have not reported yet (a node's disks, its installs,
its warnings) is None here and "—" on the page: an agent that was never asked
about its disk must not read as one with a full disk.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from aiohttp import web

import llmgw
from llmgw.adminapi import views
from llmgw.adminapi.engine_metrics import ScrapeError, scrape
from llmgw.adminapi.explain import explain_placement
from llmgw.adminapi.openapi import document
from llmgw.adminapi.weights import collect_weights
from llmgw.bodies import read_text
from llmgw.catalog import CATALOG_KEY, Catalog, DeclaredModel, UnknownModel
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.config.yamltext import MAX_BYTES as MAX_YAML_BYTES
from llmgw.control.inventory import ADMIN_STATES, READY, UNREACHABLE, Inventory, Node, NodeNotConnected
from llmgw.control.nodelogs import DEFAULT_LINES, MAX_LINES, NoAnswer, NodeLog
from llmgw.control.placement import Backoff
from llmgw.errors import ConfigError
from llmgw.pricing import price_of, unpriced_sentence
from llmgw.store.quotas import Budget

CONFIG_KEY = web.AppKey("llmgw.admin.config", ServerConfig)
INVENTORY_KEY = web.AppKey("llmgw.admin.inventory", Inventory)
# The reconciler's backoff, (model, node) -> why not now, when a reconciler runs (roles/server.py).
BACKOFF_KEY: web.AppKey[Callable[[], Mapping[tuple[str, str], Backoff]]] = web.AppKey("llmgw.admin.backoff")
# The budgets the gateway enforces now, when the server runs one (roles/server.py): a model added
# with no price while any is set is said to escape them, in the answer to the one who added it.
BUDGETS_KEY: web.AppKey[Callable[[], Sequence[Budget]]] = web.AppKey("llmgw.admin.budgets")
# The prices set with `llmgw prices set`, as the gateway last loaded them: they count as prices.
# Leader or standby (control/ha/leadership.py), read on every status.
CONTROL_PLANE_KEY: web.AppKey[Callable[[], views.ControlPlane]] = web.AppKey("llmgw.admin.control_plane")
PRICES_KEY: web.AppKey[Callable[[], Mapping[str, PriceConfig]]] = web.AppKey("llmgw.admin.prices")


# --- views ------------------------------------------------------------------------------------


def node_state(node: Node) -> views.NodeState:
    """One word for a node: what is wrong with it first, then what an administrator said."""
    if node.state == UNREACHABLE:
        return "unreachable"
    if not node.connected:
        return "disconnected"
    return _admin_state(node)


def _admin_state(node: Node) -> views.AdminState:
    # The inventory refuses any other (Inventory.set_admin_state).
    return cast(views.AdminState, node.admin_state)


def _reported(node: Node, name: str) -> Any:
    """A node attribute another part of llmgw may not have added yet: None until it has."""
    return getattr(node, name, None)


def _field(value: Any, name: str, default: Any = None) -> Any:
    return getattr(value, name, default)


def _gpus(node: Node, gpus_in_use: set[int]) -> views.GpuCounts | None:
    gpus = list(node.gpus or [])
    if not gpus:
        return None
    healthy = [g for g in gpus if _field(g, "healthy", True)]
    free = [g for g in healthy if _field(g, "index", -1) not in gpus_in_use]
    return views.GpuCounts(total=len(gpus), free=len(free), healthy=len(healthy))


def _memory(node: Node) -> views.Memory | None:
    memory = node.memory
    total = int(_field(memory, "total_mb", 0) or 0)
    if memory is None or total <= 0:
        return None
    return views.Memory(total_mb=total, available_mb=int(_field(memory, "available_mb", 0) or 0))


def _disk(node: Node) -> views.Disk | None:
    storage = _reported(node, "storage")
    if not storage:
        return None
    total = sum(int(_field(s, "total_bytes", 0) or 0) for s in storage)
    if total <= 0:
        return None
    free = sum(int(_field(s, "free_bytes", 0) or 0) for s in storage)
    return views.Disk(total_bytes=total, free_bytes=free)


def _names(items: Iterable[Any] | None, attribute: str) -> list[str] | None:
    if items is None:
        return None
    return sorted({str(_field(item, attribute, item)) for item in items if _field(item, attribute, item)})


def _unhealthy(node: Node) -> list[str]:
    problems = []
    for gpu in node.gpus or []:
        if not _field(gpu, "healthy", True):
            reason = _field(gpu, "unhealthy_reason", "") or "unhealthy"
            problems.append(
                f"GPU {_field(gpu, 'index', '?')} ({_field(gpu, 'name', '') or 'unknown'}): {reason}"
            )
    return problems


def _installs(node: Node) -> list[views.Install]:
    """Where each engine the node was asked to install stands, in the node's own words."""
    return [
        views.Install(
            engine=p.engine,
            version=p.version,
            variant=p.variant,
            # The agent's own words (agent/provision/installer.py); the document lists them.
            state=cast(views.InstallState, p.state),
            detail=p.detail,
        )
        for p in node.provision
    ]


def _host(node: Node) -> views.Host | None:
    host = node.host
    if host is None:
        return None
    return views.Host(
        os_id=host.os_id,
        os_version=host.os_version,
        os_codename=host.os_codename,
        family=host.family,
        arch=host.arch,
        cpu_flags=sorted(host.cpu_flags),
        nvidia_driver=host.nvidia_driver,
    )


def node_view(node: Node, inventory: Inventory, now: float | None = None) -> views.Node:
    """One node as the API and the cluster page show it."""
    now = inventory.now() if now is None else now
    replicas = [r for r in inventory.replicas() if r.node_id == node.id]
    in_use = {int(i) for r in replicas for i in (_field(r, "gpu_indices", None) or ())}
    installs = _installs(node)
    return views.Node(
        id=node.id,
        state=node_state(node),
        admin_state=_admin_state(node),
        connected=node.connected,
        reachable=node.state != UNREACHABLE,
        address=node.address,
        agent_version=node.agent_version,
        gpus=_gpus(node, in_use),
        memory=_memory(node),
        disk=_disk(node),
        # None: the agent has not said which engines it has, which is not the same as having none.
        engines=sorted(node.engine_versions) if node.engines_probed else None,
        classes=_names(node.gpus, "gpu_class") or [],
        fabrics=_names(_reported(node, "fabrics"), "name"),
        models=sorted({r.model for r in replicas}),
        replicas=len(replicas),
        last_seen_s=round(max(0.0, now - node.last_seen), 1) if node.last_seen else None,
        unhealthy=_unhealthy(node),
        # None: the agent has not said what it runs on (an agent older than host discovery).
        host=_host(node),
        provision=installs,
        installs_not_ready=[i for i in installs if i.state != READY],
        warnings=list(node.warnings),
    )


def nodes_view(inventory: Inventory) -> list[views.Node]:
    now = inventory.now()
    return [node_view(n, inventory, now) for n in sorted(inventory.nodes(), key=lambda n: n.id)]


def replicas_view(inventory: Inventory, model: str | None = None) -> list[views.Replica]:
    now = inventory.now()
    return [
        views.Replica(
            shard_id=r.shard_id,
            model=r.model,
            node=r.node_id,
            engine=r.engine,
            profile=r.profile,
            state=r.state,
            endpoint=r.endpoint,
            detail=r.detail,
            since_s=round(max(0.0, now - r.since), 1) if r.since else None,
        )
        for r in sorted(inventory.replicas(model), key=lambda r: (r.model, r.node_id, r.shard_id))
    ]


def failures_view(inventory: Inventory, model: str | None = None) -> list[views.Failure]:
    """The failures the control plane keeps, of model or of all, newest first."""
    failures = inventory.failures
    return [
        views.Failure(
            shard_id=f.shard_id,
            model=f.model,
            node=f.node_id,
            engine=f.engine,
            profile=f.profile,
            reason=f.reason,
            last_output=list(f.last_output),
            ago_s=round(failures.age(f), 1),
        )
        for f in failures.recent(model)
    ]


def failed_replicas_view(inventory: Inventory, model: str | None = None) -> list[views.Replica]:
    """Replicas that failed lately and are gone, for `llmgw ctl replicas --all`, newest first."""
    live = {r.shard_id for r in inventory.replicas(model)}
    return [
        views.Replica(
            shard_id=f.shard_id,
            model=f.model,
            node=f.node,
            engine=f.engine,
            profile=f.profile,
            state="failed",
            endpoint="",
            detail=f.reason,
            since_s=f.ago_s,
        )
        for f in failures_view(inventory, model)
        if f.shard_id not in live
    ]


def model_view(model: ModelConfig, inventory: Inventory, unpriced: str | None = None) -> views.Model:
    return views.Model(
        name=model.name,
        wanted=model.replicas,
        # Ready and on a reachable node: what the gateway would route to.
        ready=len(inventory.ready_endpoints(model.name)),
        engines=list(dict.fromkeys(p.engine for p in model.profiles)),
        replicas=replicas_view(inventory, model.name),
        why_not_ready=_why_not_ready(inventory, model.name),
        unpriced=unpriced,
        failures=failures_view(inventory, model.name),
    )


def _unpriced(request: web.Request, model: ModelConfig) -> str | None:
    """That budgets never bind on model, while any is set and no price applies to it; else None."""
    budgets = request.config_dict.get(BUDGETS_KEY)
    if budgets is None or not budgets():
        return None
    prices = request.config_dict.get(PRICES_KEY)
    stored = prices() if prices is not None else None
    if price_of(request.config_dict[CONFIG_KEY], model.name, model, stored) is not None:
        return None
    return unpriced_sentence([model.name])


def _why_not_ready(inventory: Inventory, model: str) -> str | None:
    """Why model serves nothing, in the words a client's 503 carries; None while it serves."""
    return None if inventory.ready_endpoints(model) else inventory.why_no_ready(model)


def models_view(inventory: Inventory, models: Sequence[ModelConfig]) -> list[views.Model]:
    """Every model of models, the live catalog's."""
    return [model_view(m, inventory) for m in models]


def status_view(
    inventory: Inventory, models: Sequence[ModelConfig], control_plane: views.ControlPlane | None = None
) -> views.Status:
    states = Counter(node_state(n) for n in inventory.nodes())
    replicas = inventory.replicas()
    return views.Status(
        version=llmgw.__version__,
        nodes=views.NodeCounts(
            total=sum(states.values()),
            ready=states["ready"],
            cordoned=states["cordoned"],
            draining=states["draining"],
            disconnected=states["disconnected"],
            unreachable=states["unreachable"],
        ),
        models=views.ModelCounts(
            total=len(models), serving=sum(1 for m in models if inventory.ready_endpoints(m.name))
        ),
        replicas=views.ReplicaCounts(total=len(replicas), ready=sum(1 for r in replicas if r.state == READY)),
        refused=[
            views.Refused(peer=r.peer, reason=r.reason, count=r.count, last_s=r.last_s)
            for r in inventory.refused.recent()
        ],
        control_plane=control_plane,
    )


def log_view(log: NodeLog) -> views.Logs:
    return views.Logs(node=log.node, source=log.source, lines=log.lines, sources=log.sources, error=log.error)


async def fetch_log(inventory: Inventory, node_id: str, source: str, lines: int) -> tuple[int, views.Logs]:
    """A node's log for the API and the page: the HTTP status and the view, its error in words."""
    source = source or "agent"
    if inventory.node(node_id) is None:
        return 404, log_view(NodeLog(node_id, source, [], [], f"no node {node_id} has registered"))
    try:
        log = await inventory.logs.fetch(node_id, source, lines)
    except NodeNotConnected as exc:
        return 502, log_view(NodeLog(node_id, source, [], ["agent"], str(exc)))
    except NoAnswer as exc:
        return 504, log_view(NodeLog(node_id, source, [], ["agent"], str(exc)))
    return (404 if log.error else 200), log_view(log)


def parse_lines(raw: str | None) -> int:
    """The `lines` query parameter, or ValueError saying what it may be."""
    if raw is None or raw == "":
        return DEFAULT_LINES
    try:
        lines = int(raw)
    except ValueError:
        raise ValueError(f"lines is {raw!r}; expected a whole number from 1 to {MAX_LINES}") from None
    if not 1 <= lines <= MAX_LINES:
        raise ValueError(f"lines is {lines}; expected a whole number from 1 to {MAX_LINES}")
    return lines


# --- admin tokens ---------------------------------------------------------------------------


def hash_token(token: str) -> str:
    """What server.yaml's admin_tokens holds for token."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_allowed(authorization: str | None, hashes: Sequence[str]) -> bool:
    """Whether an Authorization header carries a token whose digest is one of hashes."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    digest = hash_token(token.strip())
    return any(hmac.compare_digest(digest, h.strip().lower()) for h in hashes)


# --- routes ---------------------------------------------------------------------------------


def reply(view: Any, status: int = 200) -> web.Response:
    """A view, or a list of them, as the JSON the API answers with."""
    return web.json_response(views.CONVERTER.unstructure(view), status=status)


def error(status: int, message: str) -> web.Response:
    return reply(views.Error(error=message), status)


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
        text = json.dumps(views.CONVERTER.unstructure(piece))[1:-1]
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
        text = await read_text(request)
    except ValueError as exc:
        return error(400, str(exc))
    try:
        body = json.loads(text)
    except ValueError:
        return error(400, 'the body is not JSON; send {"state": "cordoned"}')
    state = body.get("state") if isinstance(body, dict) else None
    if state not in ADMIN_STATES:
        return error(400, f"state is {state!r}; expected one of {', '.join(ADMIN_STATES)}")
    inventory = request.config_dict[INVENTORY_KEY]
    inventory.set_admin_state(node.id, state)
    return reply(node_view(node, inventory))


async def get_models(request: web.Request) -> web.Response:
    models = request.config_dict[CATALOG_KEY].models()
    inventory = request.config_dict[INVENTORY_KEY]
    return reply([model_view(m, inventory, _unpriced(request, m)) for m in models])


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
        model, replaced = await catalog.add(text, source)
    except ConfigError as exc:
        return error(400, str(exc))
    except DeclaredModel as exc:
        return error(409, str(exc))
    return reply(model_view(model, inventory, _unpriced(request, model)), 200 if replaced else 201)


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
    listed = replicas_view(inventory, model)
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
    candidates = explain_placement(model, inventory, cfg, catalog.models(), backoff() if backoff else None)
    return reply(
        views.Placement(
            model=name,
            candidates=candidates,
            why_not_ready=_why_not_ready(inventory, name),
            failures=failures_view(inventory, name),
        )
    )


async def post_weights_collect(request: web.Request) -> web.Response:
    """Ask every node to remove the weights no catalog model uses (adminapi/weights.py)."""
    # JSON only, as set_node_state: a POST with no body is one a page elsewhere may send.
    if request.content_type != "application/json":
        return error(415, "send Content-Type: application/json (an empty object {} will do)")
    inventory = request.config_dict[INVENTORY_KEY]
    models = request.config_dict[CATALOG_KEY].models()
    done = await collect_weights(inventory, {m.source for m in models if m.source})
    return reply(views.Collected(nodes=done))


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(document(llmgw.__version__))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/api/v1/status", get_status),
    ("GET", "/api/v1/nodes", get_nodes),
    ("GET", "/api/v1/nodes/{id}/logs", get_node_logs),
    ("POST", "/api/v1/nodes/{id}/state", set_node_state),
    ("GET", "/api/v1/models", get_models),
    ("POST", "/api/v1/models", post_model),
    # Model names may hold slashes (meta-llama/Llama-3.1-8B).
    ("DELETE", "/api/v1/models/{name:.+}", delete_model),
    ("GET", "/api/v1/replicas", get_replicas),
    ("GET", "/api/v1/replicas/{shard_id}/metrics", get_replica_metrics),
    ("GET", "/api/v1/explain-placement", get_explain_placement),
    ("GET", "/api/v1/openapi.json", get_openapi),
    ("POST", "/api/v1/weights/collect", post_weights_collect),
)


def install(
    app: web.Application,
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    *,
    prefix: str = "",
    guard: Callable[[Handler], Handler] | None = None,
) -> None:
    """Add the admin API's routes under prefix to app, each wrapped in guard, and what they read.

    catalog is the server's live one, the one its gateway routes by: a model added here is served.
    """
    app[CONFIG_KEY] = cfg
    app[INVENTORY_KEY] = inventory
    app[CATALOG_KEY] = catalog
    for method, path, handler in ROUTES:
        app.router.add_route(method, prefix + path, guard(handler) if guard else handler)


def admin_token_or_session(
    cfg: ServerConfig, is_admin_session: Callable[[web.Request], Awaitable[bool]]
) -> Callable[[Handler], Handler]:
    """The guard of the API on the client port: an admin token, or an administrator's session.

    is_admin_session decides whether the session may do what the request asks: a change from a
    session needs the session's CSRF token too, which a script does not have; scripts use an
    admin token, and the token is what `llmgw ctl --token` sends.
    """

    def guard(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def checked(request: web.Request) -> web.StreamResponse:
            if token_allowed(request.headers.get("Authorization"), cfg.admin_tokens):
                return await handler(request)
            if await is_admin_session(request):
                return await handler(request)
            return error(
                401,
                "the admin API here needs an admin token: send 'Authorization: Bearer <token>' with a "
                "token whose sha256 is in server.yaml's admin_tokens (`llmgw ctl new-token` makes one), "
                "or an administrator's session (a change also needs its CSRF token in X-CSRF-Token), "
                "or use the admin listener on the server itself",
            )

        return checked

    return guard
