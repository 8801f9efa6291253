"""The admin API's vocabulary: each shape it answers with, as a class.

The API's handlers build these (adminapi/handlers.py), `CONVERTER` turns them
into the JSON on the wire, `llmgw ctl` turns that JSON back into them, the
cluster pages render them, and the OpenAPI document's schemas are generated
from them (adminapi/schema.py): a field added here is in all five at once.

A field's metadata "doc" is its description in the OpenAPI document. None is "the
node has not said", which is not the same as none: a node never asked about
its disk must not read as one with a full disk.

Imports nothing of the control plane, so that ctl can read a reply without
loading it.
"""

from __future__ import annotations

from typing import Literal

import attrs
import cattrs

from llmgw.maxima import MAX_NODES_AT_ONCE, MAX_TRIAL_S

AdminState = Literal["ready", "cordoned", "draining"]
# What is wrong with a node first (it stopped answering, its stream is gone), then what an
# administrator said.
NodeState = Literal["ready", "cordoned", "draining", "disconnected", "unreachable"]
InstallState = Literal["installing", "ready", "failed", "unsupported"]


# --- nodes ------------------------------------------------------------------------------------


@attrs.frozen
class GpuCounts:
    """A node's GPUs: free is healthy and not used by a replica."""

    total: int
    free: int
    healthy: int


@attrs.frozen
class Memory:
    total_mb: int
    available_mb: int


@attrs.frozen
class Disk:
    """Every filesystem the node reported, added up."""

    total_bytes: int
    free_bytes: int


@attrs.frozen
class Host:
    """The machine as the agent read it at start."""

    os_id: str = attrs.field(metadata={"doc": 'From /etc/os-release: "ubuntu".'})
    os_version: str = attrs.field(metadata={"doc": '"24.04".'})
    os_codename: str = attrs.field(metadata={"doc": '"noble"; empty where the OS has none.'})
    family: str = attrs.field(metadata={"doc": '"deb", "rpm", or empty when unknown.'})
    arch: str = attrs.field(metadata={"doc": 'In Debian\'s spelling: "amd64", "arm64".'})
    cpu_flags: list[str] = attrs.field(
        metadata={"doc": "The vector extensions inference cares about that the CPU has."}
    )
    # Empty when the node has no NVIDIA driver loaded; the CUDA build needs one.
    nvidia_driver: str = attrs.field(metadata={"doc": "The driver's version; empty when none."})


@attrs.frozen
class Install:
    """One engine a node was asked to install, in the node's own words."""

    engine: str
    version: str
    variant: str
    state: InstallState
    detail: str = attrs.field(
        metadata={"doc": 'What it is doing or what went wrong: "downloading ... (16 MB)".'}
    )


@attrs.frozen
class NodeUpgrade:
    """Where a node's last upgrade stands (docs/operations.md, Upgrading)."""

    version: str = attrs.field(metadata={"doc": "The version it was asked to run."})
    state: str = attrs.field(
        metadata={
            "doc": '"installing", "restarting", "upgraded", "refused" (nothing changed) or "rolled back".'
        }
    )
    detail: str = attrs.field(metadata={"doc": "What happened, or why it was refused or rolled back."})
    from_version: str


@attrs.frozen
class Node:
    """A node. A null value means the node has not reported it, which is not the same as none."""

    id: str = attrs.field(metadata={"doc": "The node's certificate's common name."})
    state: NodeState = attrs.field(
        metadata={"doc": "What is wrong with the node first, then what an administrator said."}
    )
    admin_state: AdminState = attrs.field(
        metadata={"doc": "What an administrator said: cordoned and draining take no new replica."}
    )
    connected: bool = attrs.field(metadata={"doc": "Whether its agent's stream is open."})
    reachable: bool = attrs.field(metadata={"doc": "False once it missed its heartbeats."})
    address: str
    agent_version: str
    gpus: GpuCounts | None
    memory: Memory | None
    disk: Disk | None
    engines: list[str] | None = attrs.field(
        metadata={"doc": "The engines it can run; null until the agent has looked."}
    )
    classes: list[str] = attrs.field(metadata={"doc": "Its GPUs' classes, as placement names them."})
    fabrics: list[str] | None
    models: list[str] = attrs.field(metadata={"doc": "The models it runs a replica of."})
    replicas: int
    last_seen_s: float | None = attrs.field(metadata={"doc": "Seconds since the node was heard."})
    unhealthy: list[str] = attrs.field(
        metadata={"doc": '"GPU 1 (H100): XID 79", one per GPU that is not healthy.'}
    )
    host: Host | None = attrs.field(metadata={"doc": "Null for an agent older than host discovery."})
    provision: list[Install] = attrs.field(
        metadata={"doc": "Every engine the node was asked to install, and where each stands."}
    )
    # What keeps an engine from running here yet; an operator's first stop.
    installs_not_ready: list[Install] = attrs.field(
        metadata={"doc": "The installs in provision that are not ready."}
    )
    warnings: list[str] = attrs.field(
        metadata={"doc": 'What slows the machine down without making it unhealthy: "no AVX2: ...".'}
    )
    upgrade: NodeUpgrade | None = attrs.field(
        default=None, metadata={"doc": "Its agent's last upgrade, as the agent said; null: none it told of."}
    )


@attrs.frozen
class UpgradeOrder:
    """What `POST /api/v1/upgrades` takes: the release, its digest, and which nodes how many at a time."""

    version: str = attrs.field(
        metadata={"schema": {"minLength": 1}, "doc": "The llmgw version to run: 0.12.0."}
    )
    sha256: str = attrs.field(
        metadata={"schema": {"minLength": 1}, "doc": "The wheel's digest, in hex: a node refuses any other."}
    )
    url: str = attrs.field(
        default="",
        metadata={
            "required": False,
            "doc": "The release's wheel: an http(s) URL, or a path on every node; empty: llmgw version's "
            "wheel from the package index (index_url, or the one each node's pip is configured with).",
        },
    )
    index_url: str = attrs.field(
        default="",
        metadata={
            "required": False,
            "doc": "The package index the release and its new dependencies come from, when url is "
            "empty; empty: the one each node's pip is configured with.",
        },
    )
    nodes: list[str] = attrs.field(
        factory=list, metadata={"required": False, "doc": "The nodes, in order; empty: every node."}
    )
    max_unavailable: int = attrs.field(
        default=1,
        metadata={
            "required": False,
            "schema": {"minimum": 1, "maximum": MAX_NODES_AT_ONCE},
            "doc": "Nodes restarting at once.",
        },
    )
    find_links: str = attrs.field(
        default="",
        metadata={"required": False, "doc": "A wheelhouse for dependencies the running agents do not have."},
    )
    trial_s: int = attrs.field(
        default=60,
        metadata={
            "required": False,
            "schema": {"minimum": 1, "maximum": MAX_TRIAL_S},
            "doc": "Seconds a new agent has to register before it goes back.",
        },
    )
    dry_run: bool = attrs.field(
        default=False, metadata={"required": False, "doc": "Only say what would be done."}
    )


@attrs.frozen
class UpgradeNode:
    """One node of a roll."""

    node: str
    from_version: str = attrs.field(metadata={"doc": "Its agent's version when the roll was planned."})
    state: str = attrs.field(
        metadata={
            "doc": '"waiting", "upgrading", "upgraded", "refused", "rolled back", "failed" or "skipped".'
        }
    )
    detail: str
    seconds: float | None = attrs.field(metadata={"doc": "How long its upgrade took, or has taken so far."})


@attrs.frozen
class Upgrade:
    """A roll of the agents to another release, under way or the last one."""

    version: str
    state: str = attrs.field(metadata={"doc": '"planned" (a dry run), "running", "done" or "stopped".'})
    detail: str = attrs.field(metadata={"doc": "Why it stopped: the first node that did not upgrade."})
    dry_run: bool
    max_unavailable: int
    seconds: float
    nodes: list[UpgradeNode]


@attrs.frozen
class StateChange:
    """A node's new state, as `POST /api/v1/nodes/{id}/state` takes it."""

    state: AdminState


# --- models and replicas ----------------------------------------------------------------------


@attrs.frozen
class Replica:
    shard_id: str
    model: str
    node: str = attrs.field(metadata={"doc": "The node it runs on."})
    engine: str
    profile: str
    state: str
    endpoint: str = attrs.field(
        metadata={"doc": "Where the gateway sends its requests; empty until it is ready."}
    )
    detail: str = attrs.field(metadata={"doc": "Why it is not ready, when it is not."})
    since_s: float | None = attrs.field(
        default=None,
        metadata={"doc": "Seconds it has been in its state (for a failed one, since it failed)."},
    )
    not_routed: str = attrs.field(
        default="",
        metadata={
            "doc": 'Why a ready replica gets no requests: "node unreachable for 20 s". '
            "Empty while the gateway routes to it, or while it is not ready."
        },
    )
    agent_unreachable_s: float | None = attrs.field(
        default=None,
        metadata={
            "doc": "Seconds its node's agent has been unreachable while the gateway still routes to it "
            "(its engine answers the gateway); null while the agent is heard from or it is not routed."
        },
    )
    retrying: str = attrs.field(
        default="",
        metadata={
            "doc": 'For a starting replica where its model failed since it last served there: "try 2; '
            'the last did not answer /health within 30 s". Empty otherwise.'
        },
    )


@attrs.frozen
class Failure:
    """A replica that failed lately, kept after the replica itself was stopped and replaced."""

    shard_id: str
    model: str
    node: str
    engine: str
    profile: str
    reason: str = attrs.field(
        metadata={"doc": 'In the node\'s words: "llamacpp exited with code 1: error: failed to load model".'}
    )
    last_output: list[str] = attrs.field(metadata={"doc": "The engine's last output lines, oldest first."})
    ago_s: float = attrs.field(metadata={"doc": "Seconds since it failed."})


@attrs.frozen
class BackingOff:
    """A node a model is not placed on until a wait after its replicas failed there is over."""

    node: str
    failures: int = attrs.field(metadata={"doc": "Its replicas' failures on the node in a row."})
    next_try_s: float = attrs.field(metadata={"doc": "Seconds until the node is tried again for the model."})


@attrs.frozen
class ColdStart:
    """A cold start measured: from the first held request to the replica ready, and its parts."""

    total_s: float = attrs.field(metadata={"doc": "The held request's whole wait, in seconds."})
    place_s: float = attrs.field(metadata={"doc": "From the request to the StartShard sent to a node."})
    weights_s: float = attrs.field(
        metadata={"doc": "From the StartShard to the engine's process started: fetching or checking weights."}
    )
    engine_s: float = attrs.field(metadata={"doc": "From the engine's process started to its first health."})
    node: str


@attrs.frozen
class Scale:
    """An on-demand model's scale (`scale:` in its definition) and the leader's last decision."""

    min: int
    max: int
    idle_s: float
    target_in_flight: float
    window_s: float
    priority: int
    replicas: int = attrs.field(metadata={"doc": "The replicas decided: what `wanted` says."})
    reason: str = attrs.field(
        metadata={"doc": 'Why, in words: "3 replicas: 14.0 in flight per replica for 60 s, target 8".'}
    )
    ready: int = attrs.field(metadata={"doc": "Ready replicas at the decision's last pass."})
    in_flight: int = attrs.field(metadata={"doc": "Requests in flight on them then."})
    per_replica: float = attrs.field(metadata={"doc": "in_flight / ready; 0 with none ready."})
    held: int = attrs.field(metadata={"doc": "Requests this server's gateway holds while a replica starts."})
    decided_s: float | None = attrs.field(metadata={"doc": "Seconds since the decision; null: none yet."})
    last_request_s: float | None = attrs.field(
        metadata={"doc": "Seconds since any gateway's last request for it; null: none known."}
    )
    eviction: str | None = attrs.field(
        metadata={"doc": "The last replica stopped to make room for it, or of it for another, in words."}
    )
    cold_start: ColdStart | None = attrs.field(
        metadata={"doc": "The last cold start measured: what the next one is expected to take."}
    )

    def words(self) -> str:
        """One line: "1 replica (min 0, max 3, idle 600 s): a request came …; … target 8; …"."""
        count = f"{self.replicas} replica{'' if self.replicas == 1 else 's'}"
        words = (
            f"{count} (min {self.min}, max {self.max}, idle {self.idle_s:g} s): {self.reason}; "
            f"now {self.per_replica:g} in flight per ready replica ({self.ready} ready), "
            f"target {self.target_in_flight:g}"
        )
        if self.held:
            words += f"; {self.held} request(s) held while it starts"
        if self.cold_start is not None:
            c = self.cold_start
            words += (
                f"; expected cold start {c.total_s:g} s, as the last on {c.node} (place {c.place_s:g} s, "
                f"weights {c.weights_s:g} s, engine start {c.engine_s:g} s)"
            )
        else:
            words += "; no cold start measured yet"
        if self.eviction:
            words += f"; {self.eviction}"
        return words


@attrs.frozen
class Model:
    """A catalog model and its replicas."""

    name: str
    wanted: int = attrs.field(metadata={"doc": "The replicas it should have."})
    ready: int = attrs.field(metadata={"doc": "Ready and on a reachable node: what the gateway routes to."})
    engines: list[str] = attrs.field(metadata={"doc": "Its profiles' engines, in order of preference."})
    replicas: list[Replica]
    why_not_ready: str | None = attrs.field(
        metadata={"doc": "Why it serves nothing, in the words a client's 503 carries."}
    )
    unpriced: str | None = attrs.field(
        default=None,
        metadata={
            "doc": "While any budget is set and no price applies to this model: that budgets never bind on "
            "what it serves, in words. Null when a price applies or no budget is set."
        },
    )
    failures: list[Failure] = attrs.field(
        factory=list,
        metadata={"doc": "Its replicas that failed lately, newest first: the last few per node."},
    )
    backing_off: list[BackingOff] = attrs.field(
        factory=list,
        metadata={
            "doc": "The nodes it is not placed on until the wait after its failures there is over, the "
            "soonest tried again first: a model failing on every node that can take it has no replica "
            "until then. Empty when it waits on none, and where this server places no models."
        },
    )
    native_apis: list[str] = attrs.field(
        factory=list,
        metadata={
            "doc": "The client APIs of its kind that its engines (every one of its profiles' engines) serve "
            "themselves: chat, completions, embeddings, messages, count_tokens, responses, rerank, "
            "transcriptions. An endpoint outside the fleet is taken to serve OpenAI's only."
        },
    )
    translated_apis: list[str] = attrs.field(
        factory=list,
        metadata={"doc": "The client APIs of its kind the gateway says to its engines as chat completions."},
    )
    scale: Scale | None = attrs.field(
        default=None,
        metadata={"doc": "An on-demand model's scale and the leader's last decision; null for a fixed one."},
    )


@attrs.frozen
class Removed:
    name: str
    removed: bool


@attrs.frozen
class ReplicaMetrics:
    """A replica's engine's own metrics page, read now."""

    shard_id: str
    model: str
    node: str
    engine: str
    url: str = attrs.field(metadata={"doc": "The page that was read."})
    metrics: dict[str, float] = attrs.field(
        metadata={"doc": 'Sample name, labels as in `n{l="v"}`, -> value.'}
    )


# --- the cluster at a glance ------------------------------------------------------------------


@attrs.frozen
class NodeCounts:
    """How many nodes are in each state, and in all."""

    total: int
    ready: int
    cordoned: int
    draining: int
    disconnected: int
    unreachable: int


@attrs.frozen
class ModelCounts:
    total: int
    serving: int = attrs.field(metadata={"doc": "Those with a ready replica."})


@attrs.frozen
class ReplicaCounts:
    total: int
    ready: int


@attrs.frozen
class Refused:
    """Agent connections refused from one address for one reason within the last hour."""

    peer: str = attrs.field(metadata={"doc": "The client's address, without its port."})
    reason: str = attrs.field(
        metadata={"doc": 'Short: "certificate not signed by this control plane\'s authority".'}
    )
    count: int
    last_s: float = attrs.field(metadata={"doc": "Seconds since the newest of them."})


@attrs.frozen
class ControlPlane:
    """This control plane among those sharing one PostgreSQL store; with SQLite, always the leader."""

    name: str = attrs.field(metadata={"doc": "control.name, or the machine's host name."})
    role: Literal["leader", "standby"] = attrs.field(
        metadata={"doc": "Only the leader accepts agents, places and reconciles; all serve their gateway."}
    )
    leader: str = attrs.field(metadata={"doc": "The leader's name; empty while none holds the lock."})
    leader_address: str = attrs.field(metadata={"doc": "The agent address the leader advertises."})


@attrs.frozen
class Status:
    """How many nodes, models and replicas, in which state."""

    version: str = attrs.field(metadata={"doc": "The control plane's llmgw."})
    nodes: NodeCounts
    models: ModelCounts
    replicas: ReplicaCounts
    refused: list[Refused] = attrs.field(
        factory=list,
        metadata={"doc": "Agent connections refused in the last hour, by address and reason."},
    )
    control_plane: ControlPlane | None = attrs.field(
        default=None,
        metadata={"doc": "Leader or standby, and who leads; absent from a server older than this field."},
    )
    agent_unreachable: int = attrs.field(
        default=0,
        metadata={
            "doc": "Of the ready replicas, those routed while their node's agent is unreachable "
            "(their engines answer the gateway)."
        },
    )


# --- logs, placement, weights -----------------------------------------------------------------


@attrs.frozen
class Logs:
    """The newest lines of one of a node's logs."""

    node: str
    source: str
    lines: list[str] = attrs.field(metadata={"doc": "Oldest first."})
    sources: list[str] = attrs.field(metadata={"doc": '"agent", and one per engine the node runs.'})
    error: str = attrs.field(metadata={"doc": "Empty, or why there are no lines."})


@attrs.frozen
class Candidate:
    """One node judged for one profile of a model."""

    profile: str
    node: str
    candidate: bool
    reason: str = attrs.field(metadata={"doc": 'Follows the node\'s name: "is cordoned", "is a candidate".'})


@attrs.frozen
class Placement:
    """Per node, whether a model's next replica could go there, and why."""

    model: str
    candidates: list[Candidate]
    why_not_ready: str | None = attrs.field(
        metadata={"doc": "Why the model serves nothing, when it does not."}
    )
    failures: list[Failure] = attrs.field(
        factory=list,
        metadata={"doc": "Its replicas that failed lately, newest first: the last few per node."},
    )
    backing_off: list[BackingOff] = attrs.field(
        factory=list,
        metadata={
            "doc": "The nodes it is not placed on until the wait after its failures there is over, the "
            "soonest tried again first: a model failing on every node that can take it has no replica "
            "until then. Empty when it waits on none, and where this server places no models."
        },
    )
    scale: Scale | None = attrs.field(
        default=None,
        metadata={"doc": "An on-demand model's scale and the leader's last decision; null for a fixed one."},
    )


@attrs.frozen
class Collection:
    """What one node was asked to remove, and what it keeps."""

    node: str
    removing: list[str]
    kept: list[str] = attrs.field(metadata={"doc": '"SOURCE (why)" for weights that stay.'})
    error: str = attrs.field(
        default="", metadata={"doc": "Why the node was not asked at all, when it was not."}
    )


@attrs.frozen
class Collected:
    """What each node was asked to remove, and what it keeps."""

    nodes: list[Collection]


@attrs.frozen
class Error:
    error: str = attrs.field(metadata={"doc": "A sentence for a person."})


# Every shape the admin API answers with, and the one body it takes (StateChange): the OpenAPI
# document's components (adminapi/openapi.py), with every class their fields hold.
SHAPES: tuple[type, ...] = (
    Status,
    Node,
    Logs,
    Model,
    Removed,
    Replica,
    ReplicaMetrics,
    Placement,
    Collected,
    Error,
    StateChange,
    UpgradeOrder,
    Upgrade,
)

# One converter both ways: the API unstructures with it, ctl structures with it.
CONVERTER = cattrs.Converter(forbid_extra_keys=False)
