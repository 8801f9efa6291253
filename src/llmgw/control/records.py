"""The records the inventory keeps of what a node says of itself: its GPUs, memory, disks, weights, host.

Slotted attrs records rather than the generated messages: a fleet of thousands
kept some 10 KB of betterproto objects per node. They carry the messages' own
field names, so every reader of a node (placement, the views, the history
charts) reads them as it read the messages. control/stream/wire.py reads them
from the wire.
"""

from __future__ import annotations

import attrs

from llmgw.proto.llmgw import v1 as pb


@attrs.frozen
class Gpu:
    index: int = 0
    uuid: str = ""
    name: str = ""
    gpu_class: str = ""
    memory_total_mb: int = 0
    memory_used_mb: int = 0
    healthy: bool = False
    unhealthy_reason: str = ""


@attrs.define
class Memory:
    """A node's memory as it last reported it: its heartbeats change it in place (Node.set_memory)."""

    total_mb: int = 0
    available_mb: int = 0


@attrs.frozen
class Fabric:
    name: str = ""
    hcas: tuple[str, ...] = ()


@attrs.frozen
class Storage:
    path: str = ""
    total_bytes: int = 0
    free_bytes: int = 0


@attrs.frozen
class Weights:
    source: str = ""
    path: str = ""
    size_bytes: int = 0
    sha256: str = ""
    in_use: bool = False


@attrs.frozen
class Host:
    os_id: str = ""
    os_version: str = ""
    os_codename: str = ""
    arch: str = ""
    cpu_flags: tuple[str, ...] = ()
    nvidia_driver: str = ""
    family: str = ""
    id_like: tuple[str, ...] = ()


@attrs.frozen
class ProvisionStatus:
    engine: str = ""
    version: str = ""
    variant: str = ""
    state: str = ""
    detail: str = ""
    # Seconds from the message until the agent tries a failed install again; None when it did not
    # say (no try scheduled, or an older agent), which is not "now". Node.provision_at dates it.
    next_try_s: int | None = None


@attrs.frozen
class UpgradeStatus:
    """Where a node's last upgrade stands, as its agent said (agent/upgrade.py)."""

    version: str = ""
    state: str = ""
    detail: str = ""
    from_version: str = ""


@attrs.frozen
class Registration:
    """A Register as the inventory keeps it; None for a message field the agent did not send."""

    node_id: str = ""
    agent_version: str = ""
    gpus: tuple[Gpu, ...] = ()
    memory: Memory | None = None
    engine_versions: dict[str, str] = attrs.field(factory=dict)
    # Rare (a node that runs engines while its control plane restarted) and read once: the
    # generated classes read these.
    running: tuple[pb.ShardStatus, ...] = ()
    weights: tuple[Weights, ...] = ()
    labels: dict[str, str] = attrs.field(factory=dict)
    fabrics: tuple[Fabric, ...] = ()
    heartbeat_interval_ms: int = 0
    storage: tuple[Storage, ...] = ()
    host: Host | None = None
    engines_probed: bool = False
    provision: tuple[ProvisionStatus, ...] = ()
    warnings: tuple[str, ...] = ()
    advertise_address: str = ""
    fabric_address: str = ""
