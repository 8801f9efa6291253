"""Why each node is or is not a place for a model's next replica: placement's own verdicts.

The admin API and `llmgw ctl explain` read this module only, so what they
show follows placement (control/placement.py) without touching them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.adminapi.views import Candidate
from llmgw.config import ModelConfig, ServerConfig
from llmgw.control import placement
from llmgw.control.estimates import Needs
from llmgw.control.inventory import Inventory


def explain_placement(
    model: ModelConfig,
    inventory: Inventory,
    cfg: ServerConfig,
    models: Sequence[ModelConfig],
    backoff: Mapping[tuple[str, str], placement.Backoff] | None = None,
    needs: Needs | None = None,
) -> list[Candidate]:
    """For every profile of model in order, every node in id order: a candidate, or why it is not.

    models is the live catalog's (llmgw/catalog.py). backoff is the
    reconciler's (`Reconciler.backoff`): without it a node the model keeps failing on would read
    "is a candidate" while placement passes it over. needs is the reconciler's too (`Reconciler.needs`):
    the estimate from the model's headers where a profile states no min_memory_mb.
    """
    nodes = sorted(inventory.nodes(), key=lambda n: n.id)
    verdicts = placement.explain(
        model, nodes, inventory.replicas(), models, cfg.control.placement, backoff, needs
    )
    return [
        Candidate(profile=v.profile, node=v.node, candidate=v.candidate, reason=v.reason or "is a candidate")
        for v in verdicts
    ]
