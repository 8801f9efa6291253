"""The scheduler: which nodes run each replica of a model, and why every other node does not.

A model stuck pending with "no suitable workers" and nothing else is what an
operator most often cannot act on, so here every node, for every profile in
order, is either a candidate or rejected with exactly one reason, in words
that name what to fix: "is draining", "does not have llamacpp installed
(installing: downloading llama-b6500-bin-ubuntu-x64.tar.gz (16 MB))", "has
too few free h100-80g GPUs (1 of 8 free, 2 needed)".

Pure: a `Scheduler` is built from a snapshot of nodes and replicas and the
catalog, does no I/O, and accounts for what it places itself (cards and
memory claimed by placed replicas, old and new, are not offered again), so
one pass of the reconciler can place many replicas on one snapshot.

Placement takes time proportional to the nodes once per profile, then a
heap pop per replica: a thousand replicas over five thousand nodes must not
hold the event loop for seconds (scripts/bench_placement.py).
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

import attrs

from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import READY, Inventory, Node, Replica
from llmgw.control.summary import summarize
from llmgw.control.verdicts import (
    BACKOFF,
    CARDS,
    ENGINE,
    FABRIC,
    GPU_CLASS,
    LABEL,
    MEMORY,
    STATE,
    Verdict,
)

__all__ = [
    "BACKOFF",
    "BINPACK",
    "CARDS",
    "ENGINE",
    "FABRIC",
    "GPU_CLASS",
    "LABEL",
    "MEMORY",
    "SPREAD",
    "STATE",
    "Backoff",
    "Placement",
    "Rank",
    "Scheduler",
    "Verdict",
    "explain",
    "gpus_needed",
]

SPREAD = "spread"
BINPACK = "binpack"

# Replicas in these states hold nothing: a failed one is about to be stopped and replaced.
_HOLDS_NOTHING = frozenset({"failed", "stopped"})


@attrs.frozen
class Backoff:
    """A node the model is not placed on for now, because its replica failed there."""

    failures: int
    # Seconds until the node is tried again for the model.
    remaining_s: float
    # Why the last one failed, in the node's words: "llamacpp exited with code 1: error: ...".
    cause: str = ""

    def reason(self) -> str:
        times = "failure" if self.failures == 1 else "failures"
        said = f"is backing off after {self.failures} {times} (next try in {self.remaining_s:.0f} s)"
        return f"{said}: {self.cause}" if self.cause else said


@attrs.frozen
class Rank:
    """One node's share of a replica: the node and the cards it gives."""

    node: str
    gpu_indices: tuple[int, ...] = ()


@attrs.frozen
class Placement:
    """Where one new replica goes: one rank per node, rank 0 first."""

    model: str
    profile: ProfileConfig
    ranks: tuple[Rank, ...]
    # The fabric a multi-node replica's nodes share; empty for a single node.
    fabric: str = ""


def gpus_needed(profile: ProfileConfig) -> int:
    """Cards each node gives one replica of profile: gpus_per_node, or 1 when only a class is named."""
    if profile.gpus_per_node > 0:
        return profile.gpus_per_node
    return 1 if profile.gpu_class else 0


class _NodeState:
    """A node as placement sees it, and what is left of it after claims.

    Its facts are copied once out of the protobuf messages: their attribute
    access costs microseconds, which over thousands of nodes and hundreds of
    profiles was most of a placement pass.
    """

    __slots__ = (
        "classes",
        "engines",
        "fabrics",
        "free",
        "free_count",
        "id",
        "labels",
        "memory_free",
        "memory_total",
        "node",
        "ready",
        "replicas",
        "unhealthy",
    )

    def __init__(self, node: Node) -> None:
        self.node = node
        self.id = node.id
        self.replicas = 0
        facts = node.facts()
        cards = facts.gpus
        # Every card's class, healthy or not: "wrong class" and "too few free" are different reasons.
        self.classes = Counter(cls for _, cls, _, _ in cards)
        # Healthy, unclaimed cards: index -> class.
        self.free: dict[int, str] = {i: cls for i, cls, healthy, _ in cards if healthy}
        self.free_count = Counter(self.free.values())
        self.ready = node.state == READY and node.connected and node.admin_state == READY
        # None when the node has not said (an agent too old to probe): then no engine is refused.
        self.engines = frozenset(node.engine_versions) if node.engines_probed else None
        self.labels = dict(node.labels)
        self.unhealthy = [(i, cls, why) for i, cls, healthy, why in cards if not healthy]
        # Total, not available: available already counts the engines placed here, and counting
        # them again as claims would leave a full node looking twice as full.
        self.memory_total = facts.memory_total_mb
        self.memory_free = self.memory_total
        self.fabrics = facts.fabrics

    def free_of(self, gpu_class: str) -> list[int]:
        return sorted(i for i, c in self.free.items() if not gpu_class or c == gpu_class)

    def count_free(self, gpu_class: str) -> int:
        return self.free_count[gpu_class] if gpu_class else len(self.free)

    def fits(self, profile: ProfileConfig) -> bool:
        """Whether what is left takes one more replica of profile (`_capacity_reason` says why not)."""
        need = gpus_needed(profile)
        if need and self.count_free(profile.gpu_class) < need:
            return False
        if profile.min_memory_mb > 0:
            return self.memory_free is not None and self.memory_free >= profile.min_memory_mb
        return True

    def claim(self, gpu_class: str, cards: int, indices: Sequence[int], memory_mb: int) -> tuple[int, ...]:
        """Take cards (the given indices, else the lowest free ones of the class) and memory."""
        taken = [i for i in indices if i in self.free]
        if not indices:
            taken = self.free_of(gpu_class)[:cards]
        for i in taken:
            self.free_count[self.free.pop(i)] -= 1
        if self.memory_free is not None:
            self.memory_free -= memory_mb
        self.replicas += 1
        return tuple(taken)

    def key(self, policy: str) -> tuple[int, int, int, str]:
        """Order among candidates; the smallest is taken first."""
        cards, memory = len(self.free), self.memory_free or 0
        if policy == BINPACK:
            # The fullest node that still fits, so whole nodes stay free for big replicas.
            return (cards, memory, -self.replicas, self.id)
        return (self.replicas, -cards, -memory, self.id)


class _Pool:
    """The nodes that pass a profile's unchanging checks, in a heap by the policy's order.

    A node's key changes when a replica is placed on it; a fresh entry is
    pushed then, and an entry whose key is no longer the node's is dropped
    when it surfaces.
    """

    def __init__(self, members: list[_NodeState], policy: str) -> None:
        self.members = members
        self.heap = [st.key(policy) for st in members]
        heapq.heapify(self.heap)
        # For a multi-node profile: a heap like `heap` per fabric, made on first use. Without them
        # each replica looked at every member, and 20,000 nodes took seconds to place.
        self.fabric_heaps: dict[str, list[tuple[int, int, int, str]]] | None = None

    def by_fabric(self, policy: str) -> dict[str, list[tuple[int, int, int, str]]]:
        if self.fabric_heaps is None:
            self.fabric_heaps = defaultdict(list)
            for st in self.members:
                for fabric in st.fabrics:
                    self.fabric_heaps[fabric].append(st.key(policy))
            for heap in self.fabric_heaps.values():
                heapq.heapify(heap)
        return self.fabric_heaps


# Nodes read per slice of Scheduler.snapshot: a few milliseconds of the loop each.
SNAPSHOT_SLICE = 1000


class Scheduler:
    """Places replicas on a snapshot of the cluster, counting what it has placed."""

    def __init__(
        self,
        nodes: Iterable[Node],
        replicas: Iterable[Replica],
        catalog: Sequence[ModelConfig] = (),
        policy: str = SPREAD,
        backoff: Mapping[tuple[str, str], Backoff] | None = None,
        now: float = 0.0,
    ) -> None:
        """now: the inventory's clock at the snapshot, which a failed install's next try is counted on."""
        states = {n.id: _NodeState(n) for n in sorted(nodes, key=lambda n: n.id)}
        self._take(states, replicas, catalog, policy, backoff, now)

    @classmethod
    async def snapshot(
        cls,
        inventory: Inventory,
        cfg: ServerConfig,
        models: Sequence[ModelConfig],
        backoff: Mapping[tuple[str, str], Backoff] | None = None,
    ) -> Scheduler:
        """for_inventory, its nodes read a slice at a time with the loop given back between slices.

        At 20,000 nodes, reading them all in one go held the loop the gateway
        serves on for tenths of a second in every pass that placed something.
        """
        states: dict[str, _NodeState] = {}
        nodes = sorted(inventory.nodes(), key=lambda n: n.id)
        for start in range(0, len(nodes), SNAPSHOT_SLICE):
            for node in nodes[start : start + SNAPSHOT_SLICE]:
                states[node.id] = _NodeState(node)
            await asyncio.sleep(0)
        scheduler = cls.__new__(cls)
        scheduler._take(states, inventory.replicas(), models, cfg.control.placement, backoff, inventory.now())
        return scheduler

    def _take(
        self,
        states: dict[str, _NodeState],
        replicas: Iterable[Replica],
        catalog: Sequence[ModelConfig],
        policy: str,
        backoff: Mapping[tuple[str, str], Backoff] | None,
        now: float,
    ) -> None:
        self._policy = policy
        self._now = now
        # (model, node) -> why the model is not placed there now; the reconciler keeps the clock.
        self._backoff = dict(backoff or {})
        self._states = states
        self._profiles = {(m.name, p.name): p for m in catalog for p in m.profiles}
        # By what a profile asks of a node: models with the same needs share one pool.
        self._pools: dict[tuple[object, ...], _Pool] = {}
        self._pools_of: dict[str, list[_Pool]] = defaultdict(list)
        # A model that could not be placed cannot be later in the same snapshot: nothing frees up.
        self._unplaceable: set[str] = set()
        for replica in replicas:
            self._hold(replica)

    @classmethod
    def for_inventory(
        cls,
        inventory: Inventory,
        cfg: ServerConfig,
        models: Sequence[ModelConfig],
        backoff: Mapping[tuple[str, str], Backoff] | None = None,
    ) -> Scheduler:
        """A snapshot of the inventory; models is the live catalog's."""
        return cls(
            inventory.nodes(), inventory.replicas(), models, cfg.control.placement, backoff, inventory.now()
        )

    def _hold(self, replica: Replica) -> None:
        st = self._states.get(replica.node_id)
        if st is None or replica.state in _HOLDS_NOTHING:
            return
        profile = self._profiles.get((replica.model, replica.profile))
        if profile is None:
            # A replica of a model no longer in the catalog still holds the cards it reported.
            st.claim("", 0, replica.gpu_indices, 0)
            return
        st.claim(profile.gpu_class, gpus_needed(profile), replica.gpu_indices, profile.min_memory_mb)

    # -- explaining ----------------------------------------------------------------

    def explain(self, model: ModelConfig) -> list[Verdict]:
        """Every node, for every profile of model in order: a candidate, or the reason it is not."""
        verdicts: list[Verdict] = []
        for profile in model.profiles:
            judged = [self._judge(st, profile, model.name) for st in self._states.values()]
            if profile.nodes > 1:
                judged = self._judge_fabrics(profile, judged)
            verdicts.extend(judged)
        return verdicts

    def why_not(self, model: ModelConfig) -> str:
        """Why no node can take a replica of model now, in one sentence for `why_no_ready`."""
        if not model.profiles:
            return "no node can run it (it has no profile)"
        if not self._states:
            return "no node can run it (no node is connected)"
        nodes = {st.id: st.node for st in self._states.values()}
        return summarize(model, self.explain(model), nodes, self._now)

    def _judge(self, st: _NodeState, profile: ProfileConfig, model: str = "") -> Verdict:
        kind, reason = _hard_reason(st, profile)
        if reason:
            return Verdict(profile=profile.name, node=st.id, reason=reason, kind=kind, hard=True)
        kind, reason = _state_reason(st, profile)
        backoff = self._backoff.get((model, st.id))
        if not reason and backoff is not None:
            kind, reason = BACKOFF, backoff.reason()
        if not reason:
            kind, reason = _capacity_reason(st, profile)
        return Verdict(profile=profile.name, node=st.id, reason=reason, kind=kind)

    def _judge_fabrics(self, profile: ProfileConfig, judged: list[Verdict]) -> list[Verdict]:
        """A candidate for a multi-node profile stays one only on a fabric with enough candidates."""
        counts = Counter(f for v in judged if v.candidate for f in self._states[v.node].fabrics)
        out = []
        for v in judged:
            fabrics = self._states[v.node].fabrics
            if v.candidate and not any(counts[f] >= profile.nodes for f in fabrics):
                have = ", ".join(f"{f} has {counts[f]}" for f in fabrics)
                v = attrs.evolve(
                    v,
                    kind=FABRIC,
                    reason=f"is on no fabric with the {profile.nodes} candidate nodes "
                    f"a replica needs ({have})",
                )
            out.append(v)
        return out

    # -- placing -------------------------------------------------------------------

    def place(self, model: ModelConfig) -> Placement | None:
        """Where one more replica of model goes, claimed at once; None when nowhere (see why_not)."""
        if model.name in self._unplaceable:
            return None
        for profile in model.profiles:
            if profile.nodes > 1:
                placement = self._place_across(model, profile)
            else:
                placement = self._place_one(model, profile)
            if placement is not None:
                return placement
        self._unplaceable.add(model.name)
        return None

    def _pool(self, profile: ProfileConfig) -> _Pool:
        needs = (
            profile.engine,
            profile.gpu_class,
            gpus_needed(profile),
            profile.nodes,
            profile.min_memory_mb,
            tuple(sorted(profile.labels.items())),
        )
        pool = self._pools.get(needs)
        if pool is None:
            members = [st for st in self._states.values() if _statically_fit(st, profile)]
            pool = self._pools[needs] = _Pool(members, self._policy)
            for st in members:
                self._pools_of[st.id].append(pool)
        return pool

    def _place_one(self, model: ModelConfig, profile: ProfileConfig) -> Placement | None:
        heap = self._pool(profile).heap
        # Nodes backing off for this model only: set aside, and back in the pool for other models.
        skipped: list[tuple[int, int, int, str]] = []
        try:
            while heap:
                key = heap[0]
                st = self._states[key[-1]]
                if key != st.key(self._policy):
                    heapq.heappop(heap)  # stale: a fresher entry was pushed when the node changed
                    continue
                if not st.fits(profile):
                    # Full for this profile, and nothing frees up within one snapshot.
                    heapq.heappop(heap)
                    continue
                if (model.name, st.id) in self._backoff:
                    skipped.append(heapq.heappop(heap))
                    continue
                rank = self._claim(st, profile)
                return Placement(model=model.name, profile=profile, ranks=(rank,))
            return None
        finally:
            for key in skipped:
                heapq.heappush(heap, key)

    def _place_across(self, model: ModelConfig, profile: ProfileConfig) -> Placement | None:
        """A multi-node replica: `nodes` candidates that share one fabric, never across two."""
        best: tuple[list[tuple[int, int, int, str]], str] | None = None
        for fabric, heap in sorted(self._pool(profile).by_fabric(self._policy).items()):
            chosen = self._smallest(heap, model, profile)
            if chosen is not None and (best is None or chosen < best[0]):
                best = (chosen, fabric)
        if best is None:
            return None
        keys, fabric = best
        ranks = tuple(self._claim(self._states[key[-1]], profile) for key in keys)
        return Placement(model=model.name, profile=profile, ranks=ranks, fabric=fabric)

    def _smallest(
        self, heap: list[tuple[int, int, int, str]], model: ModelConfig, profile: ProfileConfig
    ) -> list[tuple[int, int, int, str]] | None:
        """The keys of the first `profile.nodes` nodes in heap that can take model now, or None.

        Entries that are stale or full are dropped for good, as in _place_one;
        those looked at and kept go back.
        """
        chosen: list[tuple[int, int, int, str]] = []
        skipped: list[tuple[int, int, int, str]] = []
        try:
            while heap and len(chosen) < profile.nodes:
                key = heapq.heappop(heap)
                st = self._states[key[-1]]
                if key != st.key(self._policy) or not st.fits(profile):
                    continue
                if (model.name, st.id) in self._backoff:
                    skipped.append(key)
                else:
                    chosen.append(key)
        finally:
            for key in chosen + skipped:
                heapq.heappush(heap, key)
        return chosen if len(chosen) == profile.nodes else None

    def _claim(self, st: _NodeState, profile: ProfileConfig) -> Rank:
        taken = st.claim(profile.gpu_class, gpus_needed(profile), (), profile.min_memory_mb)
        key = st.key(self._policy)
        for pool in self._pools_of.get(st.id, ()):
            heapq.heappush(pool.heap, key)
            if pool.fabric_heaps is not None:
                for fabric in st.fabrics:
                    heapq.heappush(pool.fabric_heaps[fabric], key)
        return Rank(node=st.id, gpu_indices=taken)


def _statically_fit(st: _NodeState, profile: ProfileConfig) -> bool:
    """`_hard_reason` and `_state_reason` find nothing, unworded: run for every node and profile."""
    if not st.ready or (st.engines is not None and profile.engine not in st.engines):
        return False
    if gpus_needed(profile) and not (st.classes[profile.gpu_class] if profile.gpu_class else st.classes):
        return False
    if profile.nodes > 1 and not st.fabrics:
        return False
    return all(st.labels.get(k) == v for k, v in profile.labels.items())


def _hard_reason(st: _NodeState, profile: ProfileConfig) -> tuple[str, str]:
    """What the node can never offer the profile: GPU class, fabric, labels, memory in all.

    Checked before its state: an unreachable node, or one installing its engine, that the
    model's labels rule out must not be named as what keeps the model from serving.
    """
    if gpus_needed(profile) and not (st.classes[profile.gpu_class] if profile.gpu_class else st.classes):
        what = f"no {profile.gpu_class} GPU" if profile.gpu_class else "no GPU"
        return GPU_CLASS, f"has {what} ({_describe_gpus(st)})"
    if profile.nodes > 1 and not st.fabrics:
        return FABRIC, f"has no fabric, which a {profile.nodes}-node profile needs"
    for key, value in sorted(profile.labels.items()):
        have = st.labels.get(key)
        if have is None:
            return LABEL, f"lacks the label {key}={value}"
        if have != value:
            return LABEL, f"has the label {key}={have}, not {key}={value}"
    total = st.memory_total
    if profile.min_memory_mb > 0 and total is not None and total < profile.min_memory_mb:
        return MEMORY, _too_little_memory(st, profile)
    return "", ""


def _state_reason(st: _NodeState, profile: ProfileConfig) -> tuple[str, str]:
    """What may change on a node that passes the hard constraints: its state, its engine."""
    node = st.node
    if node.state != READY:
        return STATE, f"is {node.state}"
    if not node.connected:
        return STATE, "is not connected"
    if node.admin_state != READY:
        return STATE, f"is {node.admin_state}"
    if node.engines_probed and profile.engine not in node.engine_versions:
        return ENGINE, _not_installed(node, profile.engine)
    return "", ""


def _capacity_reason(st: _NodeState, profile: ProfileConfig) -> tuple[str, str]:
    """What placed replicas use up: free cards and memory."""
    need = gpus_needed(profile)
    cls = profile.gpu_class
    if need and (free := st.count_free(cls)) < need:
        total = st.classes[cls] if cls else sum(st.classes.values())
        reason = f"has too few free {cls + ' ' if cls else ''}GPUs ({free} of {total} free, {need} needed)"
        sick = [(i, why) for i, c, why in st.unhealthy if not cls or c == cls]
        if sick:
            whys = "; ".join(f"GPU {i}: {why or 'unhealthy'}" for i, why in sick)
            reason += f"; {len(sick)} unhealthy ({whys})"
        return CARDS, reason
    if profile.min_memory_mb > 0:
        if st.memory_free is None or st.memory_total is None:
            return MEMORY, "has not reported its memory"
        if st.memory_free < profile.min_memory_mb:
            return MEMORY, _too_little_memory(st, profile)
    return "", ""


def _too_little_memory(st: _NodeState, profile: ProfileConfig) -> str:
    free = max(st.memory_free or 0, 0)
    need = profile.min_memory_mb
    return f"has too little memory ({free} MB free of {st.memory_total} MB, {need} MB needed)"


def explain(
    model: ModelConfig,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    catalog: Sequence[ModelConfig] = (),
    policy: str = SPREAD,
    backoff: Mapping[tuple[str, str], Backoff] | None = None,
) -> list[Verdict]:
    """Every node for every profile of model: candidate or the one reason it is not, as of now."""
    return Scheduler(nodes, replicas, catalog, policy, backoff).explain(model)


def _not_installed(node: Node, engine: str) -> str:
    """In the node's own words when it is installing or failed: what it says it is doing."""
    status = next((p for p in node.provision if p.engine == engine), None)
    if status is not None and status.state != "ready" and status.detail:
        return f"does not have {engine} installed ({status.state}: {status.detail})"
    if status is not None and status.state != "ready":
        return f"does not have {engine} installed ({status.state})"
    return f"does not have {engine} installed"


def _describe_gpus(st: _NodeState) -> str:
    if not st.classes:
        return "it has no GPU"
    return "it has " + ", ".join(f"{n} × {cls or 'unknown'}" for cls, n in sorted(st.classes.items()))
