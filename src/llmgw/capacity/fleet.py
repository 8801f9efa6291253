"""The fleet as capacity planning reads it: each node's cards and memory, and a catalog model's profiles.

The admin API answers `GET /api/v1/capacity` with these (adminapi/capacity.py),
and `llmgw ctl model plan` judges them (capacity/fit.py): one shape from the
inventory to the judgement, not a dict read by string keys at both ends.
"""

from __future__ import annotations

import attrs

from llmgw.capacity.shape import ModelShape


@attrs.frozen
class Card:
    index: int
    gpu_class: str
    memory_total_mb: int
    memory_used_mb: int = attrs.field(
        metadata={"doc": "What the card reported in use: engines, other processes."}
    )
    healthy: bool
    claimed: bool = attrs.field(metadata={"doc": "A replica holds it: placement does not offer it."})

    @property
    def free_bytes(self) -> int:
        return max(self.memory_total_mb - self.memory_used_mb, 0) << 20

    @property
    def usable(self) -> bool:
        return self.healthy and not self.claimed


@attrs.frozen
class NodeCapacity:
    """One node's cards and memory. Null memory: the node has not reported it, which is not none."""

    id: str
    ready: bool = attrs.field(metadata={"doc": "Placement may use it: ready, connected, not cordoned."})
    state: str
    cards: list[Card]
    memory_total_mb: int | None
    memory_available_mb: int | None
    engines: list[str] | None = attrs.field(metadata={"doc": "Null until the agent has looked."})
    labels: dict[str, str]


@attrs.frozen
class ProfileShape:
    """What a catalog model's profile asks of a node, as capacity planning needs it."""

    name: str
    engine: str
    gpu_class: str
    gpus_per_node: int
    nodes: int
    min_memory_mb: int
    args: list[str]
    env: dict[str, str] = attrs.field(
        factory=dict,
        metadata={"doc": "The profile's env that changes what a replica holds (VLLM_CPU_KVCACHE_SPACE)."},
    )


@attrs.frozen
class CatalogModel:
    name: str
    source: str
    profiles: list[ProfileShape]


@attrs.frozen
class Capacity:
    """The fleet's nodes, the catalog model asked about (null when none was), and its shape."""

    nodes: list[NodeCapacity]
    model: CatalogModel | None = None
    shape: ModelShape | None = attrs.field(
        default=None,
        metadata={"doc": "The model's shape, read by the server from its headers; null when not read."},
    )
    shape_error: str | None = attrs.field(
        default=None, metadata={"doc": "Why the server could not read the model's headers."}
    )


SHAPES: tuple[type, ...] = (Capacity,)
