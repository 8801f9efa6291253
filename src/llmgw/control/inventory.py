"""What the control plane knows of its nodes and the replicas they run, rebuilt from what agents report.

Nothing here survives a restart on purpose: engines keep running while the
server is away, and every agent's Register lists what it runs, so the
inventory is rebuilt from the nodes themselves and nothing is started twice.

The gateway reads `ready_endpoints` on every request, so the routing table is
a precomputed dict, rebuilt only when a replica or a node changes state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence

import attrs
import betterproto
import structlog

from llmgw.control.failures import Failure, Failures
from llmgw.control.nodelogs import LogRequests
from llmgw.control.records import (
    Fabric,
    Gpu,
    Host,
    Memory,
    ProvisionStatus,
    Registration,
    Storage,
    UpgradeStatus,
    Weights,
)
from llmgw.control.stream.refusals import Refusals
from llmgw.control.stream.wire import records, registration
from llmgw.engines.registry import ENGINES
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb
from llmgw.routes import EngineRoute, Routes

log = structlog.get_logger(__name__)

READY = "ready"
UNREACHABLE = "unreachable"
# How long a request that a dying engine failed waits for its node to report why: the agent reads
# the engine's last words once its process has exited, a second or two after its last answer.
CAUSE_WAIT_S = 5.0
# What an administrator says of a node (`llmgw ctl node cordon|drain|uncordon`), apart from what
# the node says of itself: cordoned and draining nodes get no new replicas.
CORDONED = "cordoned"
DRAINING = "draining"
ADMIN_STATES = (READY, CORDONED, DRAINING)


class NodeNotConnected(LlmgwError):
    """A message was meant for a node that has no open stream."""


@attrs.frozen
class Facts:
    """A node's hardware as placement reads it (Node.facts)."""

    # (index, class, healthy, why not) of each GPU.
    gpus: tuple[tuple[int, str, bool, str], ...]
    # The names of the fabrics it is on, sorted.
    fabrics: tuple[str, ...]
    memory_total_mb: int | None
    # index -> MB free on the card (total less what it reports in use), for an estimate per card.
    gpu_free_mb: Mapping[int, int] = attrs.field(factory=dict)


@attrs.define
class Node:
    """One machine running an agent, as it last described itself."""

    id: str
    state: str = READY
    # time.monotonic() of the last message on the node's stream.
    last_seen: float = 0.0
    connected: bool = True
    # The peer address of the node's stream (host:port), as this side saw it.
    address: str = ""
    # Where the node's engines are reached (Register.advertise_address), and its address on its
    # fabric's management network (Register.fabric_address); empty when the agent did not say.
    advertise_address: str = ""
    fabric_address: str = ""
    agent_version: str = ""
    # The records of control/records.py (read from the wire by control/stream/wire.py), not the
    # generated messages: thousands of nodes keep them.
    host: Host | None = None
    # Meaningful only when engines_probed: an agent that has not probed says nothing.
    engine_versions: dict[str, str] = attrs.field(factory=dict)
    engines_probed: bool = False
    gpus: list[Gpu] = attrs.field(factory=list)
    memory: Memory | None = None
    labels: dict[str, str] = attrs.field(factory=dict)
    fabrics: list[Fabric] = attrs.field(factory=list)
    # Filesystems the node keeps weights on, with their free space.
    storage: list[Storage] = attrs.field(factory=list)
    # Weights completely on the node's disk; in_use when an engine there has them open.
    weights: list[Weights] = attrs.field(factory=list)
    # Where each wanted engine's installation stands on the node, in its words.
    provision: list[ProvisionStatus] = attrs.field(factory=list)
    # The inventory's clock when provision arrived: its next_try_s count from then.
    provision_at: float = 0.0
    # What about the machine an operator should know: "no AVX2: inference runs several times slower ...".
    warnings: list[str] = attrs.field(factory=list)
    # ready, cordoned or draining: set by an administrator, kept across the node's reconnects.
    admin_state: str = READY
    # The node's last upgrade, as its agent said after registering; None: it said nothing.
    upgrade: UpgradeStatus | None = None
    # facts()'s GPUs and fabrics, with the lists they were read from: the inventory replaces those,
    # never edits them.
    _hardware: (
        tuple[object, object, tuple[tuple[int, str, bool, str], ...], tuple[str, ...], dict[int, int]] | None
    ) = attrs.field(default=None, init=False, eq=False, repr=False)

    def facts(self) -> Facts:
        """What placement reads of the node's GPUs, fabrics and memory, out of the messages once.

        Placement reads them for every node on every pass; through betterproto's
        attribute access, that was seconds at 20,000 nodes.
        """
        hardware = self._hardware
        if hardware is None or hardware[0] is not self.gpus or hardware[1] is not self.fabrics:
            hardware = self._hardware = (
                self.gpus,
                self.fabrics,
                tuple((g.index, g.gpu_class, g.healthy, g.unhealthy_reason) for g in self.gpus),
                tuple(sorted({f.name for f in self.fabrics if f.name})),
                {g.index: max(g.memory_total_mb - g.memory_used_mb, 0) for g in self.gpus},
            )
        memory_total_mb = self.memory.total_mb if self.memory is not None else None
        return Facts(
            gpus=hardware[2], fabrics=hardware[3], memory_total_mb=memory_total_mb, gpu_free_mb=hardware[4]
        )

    def set_memory(self, total_mb: int, available_mb: int) -> None:
        """The memory a heartbeat reported, written into the node's Memory rather than a new one.

        A new one per heartbeat, replacing the last, was an object per node that
        the garbage collector's young generations never counted: at 20,000 nodes
        its collections walked 40,000 of them and held the loop 35-40 ms.
        """
        if self.memory is None:
            self.memory = Memory(total_mb=total_mb, available_mb=available_mb)
        else:
            self.memory.total_mb, self.memory.available_mb = total_mb, available_mb

    def fabric_names(self) -> set[str]:
        """The fabrics the node is on; two nodes can share a multi-node replica when these meet."""
        return {f.name for f in self.fabrics if f.name}

    def healthy_gpus(self) -> list[Gpu]:
        """The GPUs placement may use: an XID, an ECC fault or a GPU that stopped answering excludes one."""
        return [g for g in self.gpus if g.healthy]

    def has_weights(self, source: str) -> bool:
        return any(w.source == source for w in self.weights)


@attrs.define
class Replica:
    """One engine process serving a model on a node (one shard, in the agent's words)."""

    shard_id: str
    model: str
    node_id: str
    engine: str
    state: str
    endpoint: str = ""
    detail: str = ""
    last_output: list[str] = attrs.field(factory=list)
    profile: str = ""
    # The cards the shard holds; placement counts them as taken.
    gpu_indices: list[int] = attrs.field(factory=list)
    # The replica a shard is one rank of; empty for a single-node replica, whose shard is the replica.
    replica_id: str = ""
    # The inventory's clock when the replica entered its state: "starting on n2 for 40 s".
    since: float = 0.0


class Link:
    """One open stream to a node: what waits to be sent down it, and whether a newer stream replaced it."""

    __slots__ = ("node_id", "outbox", "replaced")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.outbox = Outbox()
        self.replaced = Flag()


class Outbox:
    """The messages waiting for one node's stream, read by that stream's one sender.

    asyncio.Queue's calls, without its four deques and its Event: those were
    about 3 KB of every connected node's memory, for a queue that is nearly
    always empty.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[pb.ControlMessage] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, message: pb.ControlMessage) -> None:
        self._items.append(message)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_nowait(self) -> pb.ControlMessage:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.pop(0)

    async def get(self) -> pb.ControlMessage:
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return self._items.pop(0)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class Flag:
    """asyncio.Event for one waiter, without the deque each Event keeps (about 800 bytes a node)."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None


class Inventory:
    """Nodes, their streams and their replicas; the routing table the gateway reads."""

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self._clock = clock
        self._nodes: dict[str, Node] = {}
        # The reachable nodes, the one heard from longest ago first: expire() reads only those
        # past the grace, not every node every second (4-10 ms of the loop at 10,000 nodes).
        self._by_last_seen: OrderedDict[str, Node] = OrderedDict()
        self._links: dict[str, Link] = {}
        self._replicas: dict[str, Replica] = {}
        self._ready: dict[str, tuple[str, ...]] = {}
        self._unplaced: dict[str, str] = {}
        self._admin_states: dict[str, str] = {}
        # Secrets, endpoints the gateway found dead, lost-engine signals: never shown (llmgw/routes.py).
        self._routing = Routes(clock, retry_s=grace_s)
        # Ready endpoint -> its replica, for route().
        self._by_endpoint: dict[str, Replica] = {}
        # Log requests waiting for their node's reply; the agent service resolves them.
        self.logs = LogRequests(self.send)
        # The last failures per model and node, which outlive their replicas: backoff and the
        # 503 say why with them.
        self.failures = Failures(clock)
        # Agent connections refused at the handshake or at registration.
        self.refused = Refusals(clock)
        # Set whenever placement may have something new to do; the reconciler clears it.
        self.changed = asyncio.Event()
        # How many times a node has registered: llmgw/heap.py freezes what a burst of them built.
        self.registrations = 0
        # Bumped, and routes_changed set, whenever the routing table is rebuilt: what is derived
        # from it (the table a leader publishes to its standbys) is kept until it moves.
        self.version = 0
        self.routes_changed = asyncio.Event()
        # shard -> set when its node next says it is no longer ready (failed, stopped): what a
        # gateway holding that engine's "See stack trace (above)" waits on for the cause.
        self._ending: dict[str, asyncio.Event] = {}

    # The agent service's side.

    def attach(self, register: Registration | pb.Register, address: str = "") -> Link:
        """A node registered on a new stream: adopt what it runs; a previous stream of it is replaced."""
        if not isinstance(register, Registration):
            register = registration(register)
        node_id = register.node_id
        old = self._links.get(node_id)
        if old is not None:
            log.info("node opened a newer stream; closing the old one", node=node_id)
            old.replaced.set()
        link = self._links[node_id] = Link(node_id)
        self.registrations += 1
        self.failures.forget_node(node_id)
        self._nodes[node_id] = Node(
            id=node_id,
            last_seen=self._clock(),
            address=address,
            advertise_address=register.advertise_address,
            fabric_address=register.fabric_address,
            agent_version=register.agent_version,
            host=register.host,
            engine_versions=register.engine_versions,
            engines_probed=register.engines_probed,
            gpus=list(register.gpus),
            # Its own: heartbeats write into it (Node.set_memory).
            memory=attrs.evolve(register.memory) if register.memory is not None else None,
            labels=register.labels,
            fabrics=list(register.fabrics),
            storage=list(register.storage),
            weights=list(register.weights),
            provision=list(register.provision),
            provision_at=self._clock(),
            warnings=list(register.warnings),
            admin_state=self._admin_states.get(node_id, READY),
        )
        # Read now, once, rather than by the first placement pass after a fleet registers at once.
        self._nodes[node_id].facts()
        self._by_last_seen[node_id] = self._nodes[node_id]
        self._by_last_seen.move_to_end(node_id)
        # What the node says it runs is the truth: shards we asked for and it never started are gone.
        before = {r.shard_id: r for r in self._replicas.values() if r.node_id == node_id}
        for shard_id in before:
            del self._replicas[shard_id]
        for status in register.running:
            self._replicas[status.shard_id] = _replica(node_id, status, self._clock())
            self._record_failure(node_id, status, before.get(status.shard_id))
            # How a control plane that restarted learns the secrets of the engines it adopts.
            self._routing.remember(status.shard_id, status.engine_secret)
            if status.state == READY:
                self._routing.ready_again(status.shard_id)
        log.info(
            "node registered",
            node=node_id,
            address=address,
            engines=sorted(register.engine_versions),
            running=len(register.running),
        )
        self._rebuild()
        return link

    def detach(self, link: Link) -> None:
        """A stream ended. The node keeps its state until its grace runs out: engines outlive streams."""
        if self._links.get(link.node_id) is link:
            del self._links[link.node_id]
            node = self._nodes.get(link.node_id)
            if node is not None:
                node.connected = False
            log.info("node disconnected", node=link.node_id)

    def heartbeat(self, node_id: str, heartbeat: pb.Heartbeat) -> None:
        node = self._seen(node_id)
        if heartbeat.engines_changed:
            node.engine_versions = dict(heartbeat.engine_versions)
            node.engines_probed = True
            self.changed.set()
        if heartbeat.gpus_changed:
            node.gpus = records(heartbeat.gpus, Gpu)
            # A GPU that turned unhealthy (or came back) changes where replicas may go.
            self.changed.set()
        if heartbeat.fabrics_changed:
            node.fabrics = records(heartbeat.fabrics, Fabric)
            self.changed.set()
        if heartbeat.gpus_changed or heartbeat.fabrics_changed:
            node.facts()
        if heartbeat.storage_changed:
            node.storage = records(heartbeat.storage, Storage)
        if heartbeat.weights_changed:
            node.weights = records(heartbeat.weights, Weights)
        if heartbeat.provision_changed:
            node.provision = records(heartbeat.provision, ProvisionStatus)
            node.provision_at = self._clock()
            self.changed.set()
        if heartbeat.warnings_changed:
            node.warnings = list(heartbeat.warnings)
        if betterproto.serialized_on_wire(heartbeat.memory):
            node.set_memory(heartbeat.memory.total_mb, heartbeat.memory.available_mb)

    def beat(self, node_id: str, memory: tuple[int, int] | None) -> None:
        """A heartbeat that changes nothing but, perhaps, the memory: (total_mb, available_mb)."""
        node = self._seen(node_id)
        if memory is None:
            return
        node.set_memory(*memory)

    def shard_status(self, node_id: str, status: pb.ShardStatus) -> None:
        self._seen(node_id)
        if status.state == "stopped":
            self._replicas.pop(status.shard_id, None)
        else:
            before = self._replicas.get(status.shard_id)
            # A new detail in the same state (download progress) is not a new state.
            since = before.since if before is not None and before.state == status.state else self._clock()
            self._replicas[status.shard_id] = _replica(node_id, status, since)
            self._record_failure(node_id, status, before)
            self._routing.remember(status.shard_id, status.engine_secret)
            if status.state == READY:
                self._routing.ready_again(status.shard_id)
                self.failures.served(status.model, node_id, status.shard_id)
            elif status.state == "stalled":
                # The agent kills a stalled engine next, seconds later; what the engine holds would
                # wait for that and then hear only of a connection failing. They end now, in words.
                self._routing.lose(status.shard_id, _given_up(status.state, status.detail))
        if status.state != READY and status.shard_id in self._ending:
            self._ending.pop(status.shard_id).set()
        log.info(
            "shard status",
            node=node_id,
            shard=status.shard_id,
            model=status.model,
            state=status.state,
            endpoint=status.endpoint,
            detail=status.detail,
        )
        self._rebuild()

    def upgrade_status(self, node_id: str, status: pb.UpgradeStatus | None) -> None:
        """What a node says of its last upgrade; None forgets it, as a new one is asked for."""
        node = self._nodes.get(node_id)
        if node is None:
            return
        if status is not None:
            self._seen(node_id)
            node.upgrade = UpgradeStatus(status.version, status.state, status.detail, status.from_version)
        else:
            node.upgrade = None

    def touch(self, node_id: str) -> None:
        """Any message counts as a sign of life."""
        self._seen(node_id)

    def expire(self) -> list[str]:
        """Mark nodes silent past the grace unreachable; their engines serve on while they answer the gateway.

        An agent away is not its engines away: stopped for an upgrade with
        `keep_engines_on_stop`, or cut off from the control plane alone, it
        leaves engines the gateway still reaches. Dropping them answered 503
        "unreachable" while they served. The gateway's own checks (and its
        requests) take them out of routing once they stop answering it
        (gateway/engine_checks.py).
        """
        now = self._clock()
        gone: list[Node] = []
        for node in self._by_last_seen.values():
            if now - node.last_seen <= self.grace_s:
                break
            gone.append(node)
        for node in gone:
            node.state = UNREACHABLE
            del self._by_last_seen[node.id]
            log.warning(
                "node is unreachable; its engines stay routed while they answer the gateway",
                node=node.id,
                silent_s=round(now - node.last_seen, 1),
            )
        if self._routing.retry(self._agent_connected) or gone:
            self._rebuild()
        return [n.id for n in gone]

    def unattended(self) -> list[tuple[Replica, EngineRoute]]:
        """The routed replicas whose node's agent is unreachable: only the gateway can say they serve."""
        return [
            (r, route)
            for endpoint, r in self._by_endpoint.items()
            if (node := self._nodes.get(r.node_id)) is not None
            and node.state == UNREACHABLE
            and (route := self.route(endpoint)) is not None
        ]

    def agent_unreachable_s(self, replica: Replica) -> float | None:
        """How long the agent of a routed replica's node has been silent; None when it is heard from."""
        node = self._nodes.get(replica.node_id)
        if (
            node is None
            or node.state != UNREACHABLE
            or self._by_endpoint.get(replica.endpoint) is not replica
        ):
            return None
        return max(0.0, self._clock() - node.last_seen)

    def _agent_connected(self, shard_id: str) -> bool:
        replica = self._replicas.get(shard_id)
        node = self._nodes.get(replica.node_id) if replica is not None else None
        return node is not None and node.connected and node.state == READY

    async def send(self, node_id: str, message: pb.ControlMessage) -> None:
        """Queue a message down the node's current stream."""
        link = self._links.get(node_id)
        if link is None:
            raise NodeNotConnected(f"node {node_id} is not connected")
        link.outbox.put_nowait(message)

    # Placement's side.

    def now(self) -> float:
        """The inventory's clock, which last_seen is read on."""
        return self._clock()

    def nodes(self) -> list[Node]:
        """Every node ever registered since start; treat them as read-only."""
        return list(self._nodes.values())

    def node(self, node_id: str) -> Node | None:
        return self._nodes.get(node_id)

    def replicas(self, model: str | None = None) -> list[Replica]:
        """Replicas of model (or all); treat them as read-only."""
        return [r for r in self._replicas.values() if model is None or r.model == model]

    def expect(self, node_id: str, start: pb.StartShard) -> Replica:
        """Record a StartShard just sent, so the next pass does not ask again before the node answers."""
        self._routing.remember(start.shard_id, start.engine_secret)
        replica = Replica(
            shard_id=start.shard_id,
            model=start.model,
            node_id=node_id,
            engine=start.engine,
            state="starting",
            detail=f"asked node {node_id} to start it",
            profile=start.profile,
            gpu_indices=list(start.gpu_indices),
            replica_id=start.replica_id,
            since=self._clock(),
        )
        self._replicas[start.shard_id] = replica
        self._unplaced.pop(start.model, None)
        self._rebuild()
        return replica

    def forget(self, shard_id: str) -> None:
        """Drop a replica placement has stopped."""
        if self._replicas.pop(shard_id, None) is not None:
            self._rebuild()

    def set_admin_state(self, node_id: str, state: str) -> Node:
        """Cordon, drain or make ready a known node; KeyError for an unknown one."""
        if state not in ADMIN_STATES:
            raise ValueError(f"a node's state is one of {', '.join(ADMIN_STATES)}, not {state!r}")
        node = self._nodes[node_id]
        node.admin_state = self._admin_states[node_id] = state
        log.info("node state set by an administrator", node=node_id, state=state)
        # Draining takes the node's replicas out of the routing table (or puts them back).
        self._rebuild()
        return node

    def set_unplaced(self, model: str, reason: str) -> None:
        """Why placement could not place model, in words why_no_ready repeats."""
        if self._unplaced.get(model) != reason:
            # Published to standbys with the routing table: their 503 says what the leader's does.
            self.routes_changed.set()
        self._unplaced[model] = reason

    # The gateway's side.

    def ready_endpoints(self, model: str) -> Sequence[str]:
        return self._ready.get(model, ())

    def route(self, endpoint: str) -> EngineRoute | None:
        """The node, secret and lost signal of a ready endpoint; None for one no longer ready.

        Its `lost` resolves when the engine stops answering the gateway while its node's agent is
        unreachable: nobody else will end the requests it holds.
        """
        replica = self._by_endpoint.get(endpoint)
        if replica is None:
            return None
        shard_id = replica.shard_id
        engine = ENGINES.get(replica.engine)
        return EngineRoute(
            node_id=replica.node_id,
            shard_id=shard_id,
            secret=self._routing.secret(shard_id),
            lost=self._routing.lost(shard_id),
            refused=lambda reason: self.engine_refused(shard_id, reason),
            native_apis=engine.native_apis if engine is not None else None,
            known_cause=lambda said: self._known_cause(replica, said),
        )

    async def _known_cause(self, replica: Replica, said: str) -> str:
        """Why replica's engine died, when said is its engine's word for a dead engine that names no
        cause: the client got only "See stack trace (above)", a log it cannot read.

        The engine answers that while it is still exiting, before its agent has read its last words:
        wait (CAUSE_WAIT_S at most) for the node to report it failed, so that even the first
        request to a dying engine names the cause. Else an earlier failure of the model there, as
        with an engine that dies at every first request, is what is known."""
        engine = ENGINES.get(replica.engine)
        if engine is None or not any(words in said for words in engine.dead_words):
            return ""
        own = self.failures.of_shard(replica.shard_id)
        if own is None and replica.shard_id in self._replicas:
            ending = self._ending.setdefault(replica.shard_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ending.wait(), CAUSE_WAIT_S)
            own = self.failures.of_shard(replica.shard_id)
        if own is not None:
            return f"its replica on {replica.node_id} failed: {own.reason}"
        last = self.failures.last(replica.model, replica.node_id)
        if last is None:
            return ""
        return f"the last replica of {replica.model} on {replica.node_id} failed: {last.reason}"

    def endpoint_replica(self, endpoint: str) -> Replica | None:
        """The replica behind a ready endpoint; None for one not in the routing table."""
        return self._by_endpoint.get(endpoint)

    def engine_secret(self, shard_id: str) -> str:
        """The secret replica shard_id's engine requires; for the control plane's own reads of it."""
        return self._routing.secret(shard_id)

    def engine_refused(self, shard_id: str, reason: str) -> None:
        """The gateway got no answer from the shard's engine: no more requests until it is ready again."""
        replica = self._replicas.get(shard_id)
        if replica is None or not self._routing.routable(shard_id):
            return
        self._routing.refuse(shard_id)
        log.warning(
            "an engine failed the gateway; it leaves the routing table until its node says it is ready",
            node=replica.node_id,
            shard=shard_id,
            endpoint=replica.endpoint,
            reason=reason,
        )
        self._rebuild()

    def engine_gone(self, shard_id: str, reason: str) -> None:
        """The gateway's own check of an engine whose agent is unreachable failed: out, with what it holds.

        Its requests in flight are abandoned too (`lost`): no agent will report the engine gone,
        and a host that vanished never closes their connections.
        """
        self.engine_refused(shard_id, reason)
        self._routing.lose(
            shard_id, f"it stopped answering the gateway while its node's agent is away: {reason}"
        )

    def given_up(self) -> dict[str, str]:
        """Replicas (by shard id) their node reported stalled or failed, with why, in the words that end
        a request in flight there (the leader publishes them to its standbys' gateways)."""
        return {
            r.shard_id: _given_up(r.state, r.detail)
            for r in self._replicas.values()
            if r.state in ("stalled", "failed")
        }

    def why_no_ready(self, model: str) -> str:
        """A sentence for a 503: where each replica of model is going instead of serving, node by node."""
        replicas = self.replicas(model)
        if not replicas:
            reason = self._unplaced.get(model, "no replica has been placed yet")
            return f"{model} has no ready replica: {reason}"
        now = self._clock()
        parts: Counter[str] = Counter()
        for r in sorted(replicas, key=lambda r: (r.node_id, r.state, r.shard_id)):
            parts[self._where_going(r, now)] += 1
        said = [part if count == 1 else f"{count} replicas {part}" for part, count in parts.items()]
        return f"{model} has no ready replica: {'; '.join(said)}"

    def _where_going(self, replica: Replica, now: float) -> str:
        """One replica's state in words: "downloading weights on n1: model.gguf: 1.2 of 4.1 GB"."""
        node_id = replica.node_id
        if replica.state == "starting":
            part = f"starting on {node_id} for {max(0.0, now - replica.since):.0f} s"
            retrying = self.failures.retrying(replica.model, node_id)
            if retrying:
                part += f" ({retrying})"
        elif replica.state == "downloading":
            progress = replica.detail.removeprefix("downloading ")
            part = f"downloading weights on {node_id}" + (f": {progress}" if progress else "")
        elif replica.state in ("failed", "stalled"):
            part = f"{replica.state} on {node_id}" + (f": {replica.detail}" if replica.detail else "")
        else:
            part = f"{replica.state} on {node_id}"
        node = self._nodes.get(node_id)
        if node is not None and node.state == UNREACHABLE:
            part += ", which is unreachable"
        return part

    def _record_failure(self, node_id: str, status: pb.ShardStatus, before: Replica | None) -> None:
        if status.state != "failed":
            return
        if before is not None and before.state == "failed" and before.detail == status.detail:
            return
        self.failures.add(
            Failure(
                shard_id=status.shard_id,
                model=status.model,
                node_id=node_id,
                engine=status.engine,
                profile=status.profile,
                reason=status.detail,
                last_output=tuple(status.last_output),
                at=self._clock(),
            )
        )

    def _seen(self, node_id: str) -> Node:
        node = self._nodes[node_id]
        node.last_seen = self._clock()
        if node.state == READY:
            self._by_last_seen.move_to_end(node_id)
        else:
            self._by_last_seen[node_id] = node
            node.state = READY
            log.info("node is reachable again", node=node_id)
            self._rebuild()
        return node

    def _rebuild(self) -> None:
        ready: dict[str, list[str]] = {}
        # Replicas of draining nodes get no new requests while another replica serves their model;
        # when none does, they go on serving until their replacement is ready.
        leaving: dict[str, list[str]] = {}
        self._routing.keep_only(self._replicas)
        by_endpoint: dict[str, Replica] = {}
        for r in self._replicas.values():
            node = self._nodes.get(r.node_id)
            if (
                r.state == READY
                and r.endpoint
                and node is not None
                # An unreachable node's engines too, until one fails the gateway (expire()).
                and self._routing.routable(r.shard_id)
            ):
                table = leaving if node.admin_state == DRAINING else ready
                table.setdefault(r.model, []).append(r.endpoint)
                by_endpoint[r.endpoint] = r
        self._by_endpoint = by_endpoint
        for model, endpoints in leaving.items():
            ready.setdefault(model, endpoints)
        self._ready = {model: tuple(endpoints) for model, endpoints in ready.items()}
        self.changed.set()
        self.version += 1
        self.routes_changed.set()


def _given_up(state: str, detail: str) -> str:
    """Why a request in flight to a replica its node reported stalled or failed ends."""
    return f"its node reported it {state}" + (f": {detail}" if detail else "")


def _replica(node_id: str, status: pb.ShardStatus, since: float) -> Replica:
    return Replica(
        shard_id=status.shard_id,
        model=status.model,
        node_id=node_id,
        engine=status.engine,
        state=status.state,
        endpoint=status.endpoint,
        detail=status.detail,
        last_output=list(status.last_output),
        profile=status.profile,
        gpu_indices=list(status.gpu_indices),
        replica_id=status.replica_id,
        since=since,
    )
