"""Weights collection: asking nodes to delete the weights no model in the catalog uses.

Disks fill with the versions a catalog has moved past; nothing is deleted
behind an operator's back, so collection runs when asked (`llmgw ctl weights
collect`). A node is asked only for weights no catalog model names and that
it did not report in use, and the agent checks again itself before deleting:
the engine that has a file open is the one that knows.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import structlog

from llmgw.adminapi.views import Collection
from llmgw.config import ModelConfig
from llmgw.control.inventory import Inventory, NodeNotConnected
from llmgw.control.localfiles import PREFIX, key_of
from llmgw.localsource import is_local
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)


def wanted_sources(inventory: Inventory, models: Iterable[ModelConfig]) -> set[str]:
    """The sources catalog models use, as nodes know them: a local source by the URL this server
    serves it at (control/localfiles.py), which is the one a node reports, not the path."""
    models = list(models)
    wanted = {m.source for m in models if m.source}
    served = [f"{PREFIX}/{key_of(m)}/" for m in models if is_local(m.source)]
    if served:
        for node in inventory.nodes():
            wanted.update(w.source for w in node.weights if any(s in w.source for s in served))
    return wanted


def plan_collection(inventory: Inventory, wanted: Iterable[str]) -> list[Collection]:
    """For every node, which of its weights no catalog model uses and no engine has open."""
    wanted = set(wanted)
    out = []
    for node in sorted(inventory.nodes(), key=lambda n: n.id):
        removing, kept = [], []
        # A source can have several copies on a node (one per set of pins its first copy did not
        # match): it is asked about, and removed, as one, and kept if any copy is in use.
        in_use: dict[str, bool] = {}
        for weights in node.weights:
            in_use[weights.source] = in_use.get(weights.source, False) or weights.in_use
        for source, used in in_use.items():
            if used:
                kept.append(f"{source} (an engine on {node.id} uses it)")
            elif source in wanted:
                kept.append(f"{source} (a model in the catalog uses it)")
            else:
                removing.append(source)
        out.append(Collection(node=node.id, removing=removing, kept=kept))
    return out


async def collect_weights(inventory: Inventory, wanted: Iterable[str]) -> list[Collection]:
    """Send each node a RemoveWeights for what `plan_collection` finds; what was asked of whom."""
    done = []
    for plan in plan_collection(inventory, wanted):
        if not plan.removing:
            done.append(plan)
            continue
        try:
            await inventory.send(
                plan.node, pb.ControlMessage(remove_weights=pb.RemoveWeights(sources=plan.removing))
            )
        except NodeNotConnected:
            done.append(
                attrs.evolve(
                    plan, removing=[], error=f"node {plan.node} is not connected; nothing was removed there"
                )
            )
            continue
        log.info("asked a node to remove weights no model uses", node=plan.node, sources=plan.removing)
        done.append(plan)
    return done
