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
from llmgw.control.estimates import Need, Needs
from llmgw.control.failures import GivenUp
from llmgw.control.inventory import READY, Inventory, Node, Replica
from llmgw.control.stream.provision import how_to_get
from llmgw.control.summary import summarize
from llmgw.control.verdicts import (
    BACKOFF,
    CARDS,
    ENGINE,
    FABRIC,
    GIVEN_UP,
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
    "GIVEN_UP",
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
    """A node the model is not placed on for now, or some of its profiles for good, because its replica
    failed there."""

    failures: int
    # Seconds until the node is tried again for the model; 0 or less: the wait is over, and only
    # the profiles in given_up are refused.
    remaining_s: float
    # Why the last one failed, in the node's words: "llamacpp exited with code 1: error: ...".
    cause: str = ""
    # Profiles of the model given up on the node (control/failures.py), by name.
    given_up: Mapping[str, GivenUp] = attrs.field(factory=dict)

    def refuses(self, profile: str) -> bool:
        """Whether the node is not to take a replica of the model's profile now."""
        return self.remaining_s > 0 or profile in self.given_up

    def reason(self, profile: str | None = None) -> str:
        """Why the node does not take profile (any profile, when None), after the node's name."""
        gave = self.given_up.get(profile) if profile is not None else None
        if gave is not None:
            return gave.words()
        if self.remaining_s <= 0 and self.given_up:
            return "; ".join(f"for profile {p} {g.words()}" for p, g in sorted(self.given_up.items()))
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
        "free_mb",
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
        self.free_mb = facts.gpu_free_mb

    def free_of(self, gpu_class: str) -> list[int]:
        return sorted(i for i, c in self.free.items() if not gpu_class or c == gpu_class)

    def count_free(self, gpu_class: str) -> int:
        return self.free_count[gpu_class] if gpu_class else len(self.free)

    def roomy(self, gpu_class: str, card_mb: int) -> list[int]:
        """The free cards of the class with card_mb free on each (all free ones when card_mb is 0)."""
        free = self.free_of(gpu_class)
        return [i for i in free if self.free_mb.get(i, 0) >= card_mb] if card_mb else free

    def fits(self, profile: ProfileConfig, need: Need | None = None) -> bool:
        """Whether what is left takes one more replica of profile (`_capacity_reason` says why not)."""
        cards, card_mb = gpus_needed(profile), _card_mb(profile, need)
        if cards and self.count_free(profile.gpu_class) < cards:
            return False
        if card_mb and len(self.roomy(profile.gpu_class, card_mb)) < cards:
            return False
        memory_mb = _memory_mb(profile, need)
        if memory_mb > 0:
            return self.memory_free is not None and self.memory_free >= memory_mb
        return True

    def claim(
        self, gpu_class: str, cards: int, indices: Sequence[int], memory_mb: int, card_mb: int = 0
    ) -> tuple[int, ...]:
        """Take cards (the given indices, else the lowest free ones of the class with card_mb) and memory."""
        taken = [i for i in indices if i in self.free]
        if not indices:
            taken = self.roomy(gpu_class, card_mb)[:cards]
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
        needs: Needs | None = None,
    ) -> None:
        """now: the inventory's clock at the snapshot, which a failed install's next try is counted on.

        needs: each (model, profile)'s estimate from its headers (control/estimates.py), for profiles
        that state no min_memory_mb.
        """
        states = {n.id: _NodeState(n) for n in sorted(nodes, key=lambda n: n.id)}
        self._take(states, replicas, catalog, policy, backoff, now, needs)

    @classmethod
    async def snapshot(
        cls,
        inventory: Inventory,
        cfg: ServerConfig,
        models: Sequence[ModelConfig],
        backoff: Mapping[tuple[str, str], Backoff] | None = None,
        needs: Needs | None = None,
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
        scheduler._take(
            states, inventory.replicas(), models, cfg.control.placement, backoff, inventory.now(), needs
        )
        return scheduler

    def _take(
        self,
        states: dict[str, _NodeState],
        replicas: Iterable[Replica],
        catalog: Sequence[ModelConfig],
        policy: str,
        backoff: Mapping[tuple[str, str], Backoff] | None,
        now: float,
        needs: Needs | None,
    ) -> None:
        self._policy = policy
        self._needs = dict(needs or {})
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
        # Where each model's weights already are, by source and by pinned digest: made on first use.
        self._weights_index: dict[str, list[_NodeState]] | None = None
        for replica in replicas:
            self._hold(replica)

    @classmethod
    def for_inventory(
        cls,
        inventory: Inventory,
        cfg: ServerConfig,
        models: Sequence[ModelConfig],
        backoff: Mapping[tuple[str, str], Backoff] | None = None,
        needs: Needs | None = None,
    ) -> Scheduler:
        """A snapshot of the inventory; models is the live catalog's."""
        return cls(
            inventory.nodes(),
            inventory.replicas(),
            models,
            cfg.control.placement,
            backoff,
            inventory.now(),
            needs,
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
        need = self._needs.get((replica.model, replica.profile))
        st.claim(profile.gpu_class, gpus_needed(profile), replica.gpu_indices, _memory_mb(profile, need))

    # -- explaining ----------------------------------------------------------------

    def explain(self, model: ModelConfig) -> list[Verdict]:
        """Every node, for every profile of model in order: a candidate, or the reason it is not."""
        verdicts: list[Verdict] = []
        for profile in model.profiles:
            need = self._needs.get((model.name, profile.name))
            judged = [self._judge(st, profile, model.name, need) for st in self._states.values()]
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
        needs = {p.name: n.words() for p in model.profiles if (n := self._needs.get((model.name, p.name)))}
        return summarize(model, self.explain(model), nodes, self._now, needs)

    def _judge(self, st: _NodeState, profile: ProfileConfig, model: str, need: Need | None) -> Verdict:
        kind, reason = _hard_reason(st, profile, need)
        if reason:
            return Verdict(profile=profile.name, node=st.id, reason=reason, kind=kind, hard=True)
        kind, reason = _state_reason(st, profile)
        backoff = self._backoff.get((model, st.id))
        if not reason and backoff is not None and backoff.refuses(profile.name):
            kind = GIVEN_UP if profile.name in backoff.given_up else BACKOFF
            reason = backoff.reason(profile.name)
        if not reason:
            kind, reason = _capacity_reason(st, profile, need)
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
            need = self._needs.get((model.name, profile.name))
            if profile.nodes > 1:
                placement = self._place_across(model, profile, need)
            else:
                placement = self._place_one(model, profile, need)
            if placement is not None:
                return placement
        self._unplaceable.add(model.name)
        return None

    def _pool(self, profile: ProfileConfig, need: Need | None = None) -> _Pool:
        needs = (
            profile.engine,
            profile.gpu_class,
            gpus_needed(profile),
            profile.nodes,
            _memory_mb(profile, need),
            _card_mb(profile, need),
            tuple(sorted(profile.labels.items())),
        )
        pool = self._pools.get(needs)
        if pool is None:
            members = [st for st in self._states.values() if _statically_fit(st, profile)]
            pool = self._pools[needs] = _Pool(members, self._policy)
            for st in members:
                self._pools_of[st.id].append(pool)
        return pool

    def _place_one(self, model: ModelConfig, profile: ProfileConfig, need: Need | None) -> Placement | None:
        if model.scale is not None:
            warm = self._place_warm(model, profile, need)
            if warm is not None:
                return warm
        heap = self._pool(profile, need).heap
        # Nodes backing off for this model only: set aside, and back in the pool for other models.
        skipped: list[tuple[int, int, int, str]] = []
        try:
            while heap:
                key = heap[0]
                st = self._states[key[-1]]
                if key != st.key(self._policy):
                    heapq.heappop(heap)  # stale: a fresher entry was pushed when the node changed
                    continue
                if not st.fits(profile, need):
                    # Full for this profile, and nothing frees up within one snapshot.
                    heapq.heappop(heap)
                    continue
                if self._backs_off(model, profile, st):
                    skipped.append(heapq.heappop(heap))
                    continue
                rank = self._claim(st, profile, need)
                return Placement(model=model.name, profile=profile, ranks=(rank,))
            return None
        finally:
            for key in skipped:
                heapq.heappush(heap, key)

    def _place_warm(self, model: ModelConfig, profile: ProfileConfig, need: Need | None) -> Placement | None:
        """An on-demand model's replica on a node that still holds its weights, where one can take it.

        A model scaled to zero keeps its weights on the node that served it, so that its next start is
        the engine's start alone; placed by the policy's order instead, it could land on another node
        and wait for the whole download again.
        """
        for st in self._holders(model):
            if (
                _statically_fit(st, profile)
                and st.fits(profile, need)
                and not self._backs_off(model, profile, st)
            ):
                rank = self._claim(st, profile, need)
                return Placement(model=model.name, profile=profile, ranks=(rank,))
        return None

    def _holders(self, model: ModelConfig) -> list[_NodeState]:
        """The nodes whose weights cache holds model's weights: a copy of its source, or a file it pins."""
        if self._weights_index is None:
            index: dict[str, list[_NodeState]] = defaultdict(list)
            for st in self._states.values():
                for held in st.node.weights:
                    index[held.source].append(st)
                    if held.sha256:
                        index[_digest(held.sha256)].append(st)
            self._weights_index = index
        keys = [model.source, *(_digest(pin) for pin in model.sha256.values())]
        seen: dict[str, _NodeState] = {}
        for key in keys:
            for st in self._weights_index.get(key, ()):
                seen.setdefault(st.id, st)
        return sorted(seen.values(), key=lambda st: st.id)

    def _place_across(
        self, model: ModelConfig, profile: ProfileConfig, need: Need | None
    ) -> Placement | None:
        """A multi-node replica: `nodes` candidates that share one fabric, never across two."""
        best: tuple[list[tuple[int, int, int, str]], str] | None = None
        for fabric, heap in sorted(self._pool(profile, need).by_fabric(self._policy).items()):
            chosen = self._smallest(heap, model, profile, need)
            if chosen is not None and (best is None or chosen < best[0]):
                best = (chosen, fabric)
        if best is None:
            return None
        keys, fabric = best
        ranks = tuple(self._claim(self._states[key[-1]], profile, need) for key in keys)
        return Placement(model=model.name, profile=profile, ranks=ranks, fabric=fabric)

    def _smallest(
        self,
        heap: list[tuple[int, int, int, str]],
        model: ModelConfig,
        profile: ProfileConfig,
        need: Need | None,
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
                if key != st.key(self._policy) or not st.fits(profile, need):
                    continue
                if self._backs_off(model, profile, st):
                    skipped.append(key)
                else:
                    chosen.append(key)
        finally:
            for key in chosen + skipped:
                heapq.heappush(heap, key)
        return chosen if len(chosen) == profile.nodes else None

    def _backs_off(self, model: ModelConfig, profile: ProfileConfig, st: _NodeState) -> bool:
        backoff = self._backoff.get((model.name, st.id))
        return backoff is not None and backoff.refuses(profile.name)

    def _claim(self, st: _NodeState, profile: ProfileConfig, need: Need | None = None) -> Rank:
        memory_mb, card_mb = _memory_mb(profile, need), _card_mb(profile, need)
        taken = st.claim(profile.gpu_class, gpus_needed(profile), (), memory_mb, card_mb)
        key = st.key(self._policy)
        for pool in self._pools_of.get(st.id, ()):
            heapq.heappush(pool.heap, key)
            if pool.fabric_heaps is not None:
                for fabric in st.fabrics:
                    heapq.heappush(pool.fabric_heaps[fabric], key)
        return Rank(node=st.id, gpu_indices=taken)


def _memory_mb(profile: ProfileConfig, need: Need | None) -> int:
    """RAM one replica takes: min_memory_mb where stated, else the estimate of one not on GPUs."""
    if profile.min_memory_mb > 0:
        return profile.min_memory_mb
    return need.share_mb if need is not None and need.cards == 0 else 0


def _card_mb(profile: ProfileConfig, need: Need | None) -> int:
    """Memory each card of one replica needs: the estimate's share, where min_memory_mb is not stated."""
    if profile.min_memory_mb > 0 or need is None:
        return 0
    return need.share_mb if need.cards else 0


def _digest(pin: str) -> str:
    """A sha256 as the weights index keys it, whether written `sha256:HEX` or HEX, in any case."""
    return "sha256:" + pin.removeprefix("sha256:").strip().lower()


def _statically_fit(st: _NodeState, profile: ProfileConfig) -> bool:
    """`_hard_reason` and `_state_reason` find nothing, unworded: run for every node and profile."""
    if not st.ready or (st.engines is not None and profile.engine not in st.engines):
        return False
    if gpus_needed(profile) and not (st.classes[profile.gpu_class] if profile.gpu_class else st.classes):
        return False
    if profile.nodes > 1 and not st.fabrics:
        return False
    return all(st.labels.get(k) == v for k, v in profile.labels.items())


def _hard_reason(st: _NodeState, profile: ProfileConfig, need: Need | None) -> tuple[str, str]:
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
    total, memory_mb = st.memory_total, _memory_mb(profile, need)
    if memory_mb > 0 and total is not None and total < memory_mb:
        return MEMORY, _too_little_memory(st, profile, need)
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


def _capacity_reason(st: _NodeState, profile: ProfileConfig, need: Need | None) -> tuple[str, str]:
    """What placed replicas use up: free cards and memory."""
    cards = gpus_needed(profile)
    cls = profile.gpu_class
    if cards and (free := st.count_free(cls)) < cards:
        total = st.classes[cls] if cls else sum(st.classes.values())
        reason = f"has too few free {cls + ' ' if cls else ''}GPUs ({free} of {total} free, {cards} needed)"
        sick = [(i, why) for i, c, why in st.unhealthy if not cls or c == cls]
        if sick:
            whys = "; ".join(f"GPU {i}: {why or 'unhealthy'}" for i, why in sick)
            reason += f"; {len(sick)} unhealthy ({whys})"
        return CARDS, reason
    card_mb = _card_mb(profile, need)
    if card_mb and need is not None and len(roomy := st.roomy(cls, card_mb)) < cards:
        most = max((st.free_mb.get(i, 0) for i in st.free_of(cls)), default=0)
        return CARDS, (
            f"has too few free {cls + ' ' if cls else ''}GPUs with the memory a replica needs "
            f"({len(roomy)} of {st.count_free(cls)} free cards, {cards} needed; "
            f"{most} MB free on its best; the model needs {need.words()})"
        )
    memory_mb = _memory_mb(profile, need)
    if memory_mb > 0:
        if st.memory_free is None or st.memory_total is None:
            return MEMORY, "has not reported its memory"
        if st.memory_free < memory_mb:
            return MEMORY, _too_little_memory(st, profile, need)
    return "", ""


def _too_little_memory(st: _NodeState, profile: ProfileConfig, need: Need | None) -> str:
    free = max(st.memory_free or 0, 0)
    if profile.min_memory_mb > 0 or need is None:
        wanted = f"{profile.min_memory_mb} MB needed"
    else:
        wanted = f"the model needs {need.words()}"
    return f"has too little memory ({free} MB free of {st.memory_total} MB, {wanted})"


def explain(
    model: ModelConfig,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    catalog: Sequence[ModelConfig] = (),
    policy: str = SPREAD,
    backoff: Mapping[tuple[str, str], Backoff] | None = None,
    needs: Needs | None = None,
) -> list[Verdict]:
    """Every node for every profile of model: candidate or the one reason it is not, as of now."""
    return Scheduler(nodes, replicas, catalog, policy, backoff, needs=needs).explain(model)


def _not_installed(node: Node, engine: str) -> str:
    """In the node's own words when it is installing or failed: what it says it is doing."""
    status = next((p for p in node.provision if p.engine == engine), None)
    if status is not None and status.state != "ready" and status.detail:
        return f"does not have {engine} installed ({status.state}: {status.detail})"
    if status is not None and status.state != "ready":
        return f"does not have {engine} installed ({status.state})"
    if status is None and (how := how_to_get(engine)):
        # Not asked to install it at all: what a person sets is the one thing to say.
        return f"does not have {engine} installed: {how}"
    return f"does not have {engine} installed"


def _describe_gpus(st: _NodeState) -> str:
    if not st.classes:
        return "it has no GPU"
    return "it has " + ", ".join(f"{n} × {cls or 'unknown'}" for cls, n in sorted(st.classes.items()))
