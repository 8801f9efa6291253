"""`GET /api/v1/capacity`: each node's cards and memory, and a catalog model's source and profiles.

What `llmgw ctl model plan` judges a model's estimate against. `/api/v1/nodes`
counts a node's cards; planning needs each card's memory, free and claimed, so
it has a route of its own rather than making every node listing larger.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.adminapi.handlers import INVENTORY_KEY
from llmgw.adminapi.projections import node_state
from llmgw.adminapi.replies import error, reply
from llmgw.adminapi.routes import Param, Reply, Route
from llmgw.adminapi.views import Error
from llmgw.capacity.fleet import Capacity, Card, CatalogModel, NodeCapacity, ProfileShape
from llmgw.catalog import CATALOG_KEY
from llmgw.config import ModelConfig
from llmgw.control.inventory import READY, Inventory, Node


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


async def get_capacity(request: web.Request) -> web.Response:
    inventory = request.config_dict[INVENTORY_KEY]
    name = request.query.get("model", "")
    model = None
    if name:
        catalog = request.config_dict[CATALOG_KEY]
        found = catalog.get(name)
        if found is None:
            known = ", ".join(catalog.names()) or "nothing"
            return error(404, f"no model {name} in the catalog; it has {known}")
        model = catalog_model(found)
    return reply(Capacity(nodes=fleet_capacity(inventory), model=model))


ROUTES: tuple[Route, ...] = (
    Route(
        method="GET",
        path="/api/v1/capacity",
        handler=get_capacity,
        operation="capacity",
        summary="Every node's cards and memory, and a catalog model's source and profiles.",
        description="What `llmgw ctl model plan` judges a model's estimated memory against.",
        parameters=(Param("model", "query", "A catalog model whose source and profiles to include."),),
        replies={
            200: Reply("The nodes, by id, and the model asked about.", Capacity),
            404: Reply("No such model in the catalog.", Error),
        },
    ),
)
