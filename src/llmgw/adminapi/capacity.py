"""`GET /api/v1/capacity`: each node's cards and memory, a catalog model's source and profiles, its shape.

What `llmgw ctl model plan` judges a model's estimate against. `/api/v1/nodes`
counts a node's cards; planning needs each card's memory, free and claimed, so
it has a route of its own rather than making every node listing larger.

The model's shape is read here, from its headers over HTTP (a catalog model's
source, or `?source=`), by the reader placement uses (control/estimates.py):
ctl may run where the files are not, and only the server holds the mirror's
client certificate that resolves a `mirror:` source.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.adminapi.handlers import INVENTORY_KEY
from llmgw.adminapi.projections import node_state
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Param, Reply, Route
from llmgw.adminapi.views import Error
from llmgw.capacity.estimate import MEMORY_ENV
from llmgw.capacity.fleet import Capacity, Card, CatalogModel, NodeCapacity, ProfileShape
from llmgw.capacity.shape import ModelShape
from llmgw.catalog import CATALOG_KEY
from llmgw.config import ModelConfig
from llmgw.control.estimates import remote_shape
from llmgw.control.inventory import READY, Inventory, Node
from llmgw.control.mirror import MIRROR_CLIENT_KEY
from llmgw.errors import LlmgwError
from llmgw.hubref import SOURCE_PREFIX
from llmgw.localsource import is_local

# Reading one model's headers for a planner who waits on the answer.
SHAPE_TIMEOUT_S = 10.0


def node_capacity(node: Node, claimed: set[int]) -> NodeCapacity:
    memory = node.memory
    return NodeCapacity(
        id=node.id,
        # As placement counts a node it may place on (control/placement.py).
        ready=node.state == READY and node.connected and node.admin_state == READY,
        state=node_state(node),
        cards=[
            Card(
                index=g.index,
                gpu_class=g.gpu_class,
                memory_total_mb=g.memory_total_mb,
                memory_used_mb=g.memory_used_mb,
                healthy=g.healthy,
                claimed=g.index in claimed,
            )
            for g in node.gpus
        ],
        memory_total_mb=memory.total_mb if memory is not None else None,
        memory_available_mb=memory.available_mb if memory is not None else None,
        engines=sorted(node.engine_versions) if node.engines_probed else None,
        labels=dict(node.labels),
    )


def catalog_model(model: ModelConfig) -> CatalogModel:
    return CatalogModel(
        name=model.name,
        source=model.source,
        profiles=[
            ProfileShape(
                name=p.name,
                engine=p.engine,
                gpu_class=p.gpu_class,
                gpus_per_node=p.gpus_per_node,
                nodes=p.nodes,
                min_memory_mb=p.min_memory_mb,
                args=list(p.args),
                env={k: v for k, v in p.env.items() if k in MEMORY_ENV},
            )
            for p in model.profiles
        ],
    )


def fleet_capacity(inventory: Inventory) -> list[NodeCapacity]:
    claimed: dict[str, set[int]] = {}
    for replica in inventory.replicas():
        if replica.state not in ("failed", "stopped"):
            claimed.setdefault(replica.node_id, set()).update(replica.gpu_indices)
    nodes = sorted(inventory.nodes(), key=lambda n: n.id)
    return [node_capacity(n, claimed.get(n.id, set())) for n in nodes]


def _readable(source: str) -> bool:
    """A source the server reads headers from; a path only as a catalog model's source, which the
    operator named (get_capacity takes no path from its caller)."""
    return source.startswith((SOURCE_PREFIX, "http://", "https://")) or is_local(source)


async def read_model_shape(request: web.Request, source: str) -> tuple[ModelShape | None, str | None]:
    """(shape, None), or (None, the reader's sentence); (None, None): not the server's to read."""
    if not _readable(source):
        return None, None
    mirror = request.config_dict.get(MIRROR_CLIENT_KEY)
    try:
        shape = await remote_shape(source, mirror.resolve if mirror else None, SHAPE_TIMEOUT_S)
    except LlmgwError as exc:
        return None, str(exc)
    return shape, None


async def get_capacity(request: web.Request) -> web.Response:
    inventory = request.config_dict[INVENTORY_KEY]
    name = request.query.get("model", "")
    source = request.query.get("source", "")
    # Only the mirror: a URL given here would have the server fetch from wherever the caller names
    # (a catalog model's own URL is the operator's, read as placement reads it).
    if "source" in request.query and not source.startswith(SOURCE_PREFIX):
        return error(400, f"source {source!r} is not mirror:REPO@REVISION")
    model = None
    if name:
        catalog = request.config_dict[CATALOG_KEY]
        found = catalog.get(name)
        if found is None:
            known = ", ".join(catalog.names()) or "nothing"
            return error(404, f"no model {name} in the catalog; it has {known}")
        model = catalog_model(found)
        # A source given as well is read in place of the model's: its profiles, another revision.
        source = source or found.source
    shape, why = await read_model_shape(request, source) if source else (None, None)
    return reply(Capacity(nodes=fleet_capacity(inventory), model=model, shape=shape, shape_error=why))


ROUTES: tuple[Route, ...] = (
    Route(
        method="GET",
        path="/api/v1/capacity",
        handler=get_capacity,
        operation="capacity",
        summary="Every node's cards and memory, and a catalog model's source, profiles and shape.",
        description=(
            "What `llmgw ctl model plan` judges a model's estimated memory against. The model's shape "
            "is read from its headers (never its weights) when its source is mirror:REPO@REVISION or "
            "an http(s) URL; shape_error says why not when they cannot be read."
        ),
        parameters=(
            Param("model", "query", "A catalog model whose source, profiles and shape to include."),
            Param(
                "source",
                "query",
                "mirror:REPO@REVISION: a model on the mirror whose shape to read (in place of the "
                "catalog model's source, with model).",
                schema={"type": "string", "pattern": "^mirror:"},
            ),
        ),
        replies={
            200: Reply("The nodes, by id, and the model asked about.", Capacity),
            400: Reply("A source that is not mirror:REPO@REVISION.", Error),
            404: Reply("No such model in the catalog.", Error),
        },
    ),
)
