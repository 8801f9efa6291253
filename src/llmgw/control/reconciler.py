"""Keeps the replicas of every catalog model running: places missing ones, replaces failed ones.

Where a replica goes is control/placement.py's to say (profiles in order,
GPUs, memory, fabrics, labels, spread or binpack); this loop decides how many
are missing and carries the decision out.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import Callable, Mapping

import structlog
from prometheus_client import CollectorRegistry

from llmgw.backoff import ExponentialBackoff
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.estimates import Estimates, Needs
from llmgw.control.failures import Failure
from llmgw.control.inventory import DRAINING, READY, Inventory, Node, NodeNotConnected, Replica
from llmgw.control.localfiles import LocalFiles
from llmgw.control.metrics import ControlMetrics, reject_reason
from llmgw.control.mirror import MirrorClient, MirrorError
from llmgw.control.placement import Backoff, Scheduler
from llmgw.control.scaling import Scaler
from llmgw.control.verdicts import CARDS, MEMORY
from llmgw.engines.registry import ENGINES
from llmgw.hubref import SOURCE_PREFIX
from llmgw.localsource import is_local
from llmgw.names import shard_stem
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 300.0
# Where rank 0 of a multi-node replica listens for the other ranks (torch.distributed's usual port).
MASTER_PORT = 29500


class Reconciler:
    """Compares the catalog with the inventory every control.interval_s, or sooner when something changes."""

    def __init__(
        self,
        cfg: ServerConfig,
        inventory: Inventory,
        catalog: Catalog,
        *,
        in_flight: Mapping[str, int],
        clock: Callable[[], float] = time.monotonic,
        metrics: ControlMetrics | None = None,
        mirror: MirrorClient | None = None,
        local_files: LocalFiles | None = None,
        scaler: Scaler | None = None,
    ) -> None:
        """in_flight is the gateway's table of requests in flight by endpoint (its router's);
        metrics counts passes and failed placements (in a registry no one reads when None).

        mirror resolves a model's `mirror:REPO[@REVISION]` source to the mirror's URL and pins;
        local_files, a source on this machine's disk to the URL this server serves it at.
        scaler decides how many replicas each on-demand model runs (control/scaling.py); without one,
        its models start at their scale.min and follow the load, with no gateway's requests held.
        """
        self._metrics = metrics if metrics is not None else ControlMetrics(CollectorRegistry())
        self._cfg = cfg
        self._mirror = mirror
        self._local_files = local_files
        self._inventory = inventory
        # The live catalog: server.yaml's models and those added with ctl.
        self._catalog = catalog
        self._clock = clock
        # (model, node) -> (failures there in a row, clock time before which it is not placed there)
        self._backoff: dict[tuple[str, str], tuple[int, float]] = {}
        # Shards started where their model had failed: the backoff there ends once one is ready.
        self._retries: dict[str, tuple[str, str]] = {}
        # A draining replica is stopped once its count here is zero.
        self._in_flight = in_flight
        self.scaler = scaler if scaler is not None else Scaler(in_flight)
        # replica (or shard) id -> clock time it was first seen draining, for control.drain_timeout_s.
        self._draining_since: dict[str, float] = {}
        self._scheduler: Scheduler | None = None
        # What each model's replica needs by its headers, read when its definition changes.
        self._estimates = Estimates(mirror.resolve if mirror is not None else None)
        # Each model's definition as the last pass saw it: a change is worth a try on the nodes
        # its profiles were given up on (control/failures.py).
        self._definitions: dict[str, ModelConfig] = {}
        # A model added or removed is acted on now, not at the next interval.
        self._catalog.subscribe(inventory.changed.set)

    async def run(self) -> None:
        """Reconcile until cancelled."""
        changed = self._inventory.changed
        # Each term as leader goes on from the scale decisions the store kept.
        await self.scaler.load()
        self.scaler.deciding = True
        try:
            await self._run(changed)
        finally:
            self.scaler.deciding = False

    async def _run(self, changed: asyncio.Event) -> None:
        while True:
            changed.clear()
            try:
                with self._metrics.reconcile_seconds.time():
                    await self.reconcile()
            except Exception:
                # A bug in one pass must not stop every later one; the next pass starts from the inventory.
                log.exception("reconcile pass failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands as the event
            # fires, and this loop then ran on with nothing able to stop it (a server hung shutting down).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._cfg.control.interval_s):
                    await changed.wait()

    async def reconcile(self) -> None:
        """One pass over the catalog."""
        # A model served by endpoints outside the fleet is not placed; replicas it had are stopped.
        models = [m for m in self._catalog.models() if not m.endpoints]
        catalog = {m.name: m for m in models}
        await self._estimates.refresh(models)
        # Removed, or defined anew: `ctl model remove` then `add` is a change as much as `add` again.
        for name, before in self._definitions.items():
            if catalog.get(name) != before:
                self._inventory.failures.forget_model(name)
        self._definitions = catalog
        # One snapshot per pass, built at the first placement, counting what this pass places. A
        # replica stopped later in the pass still holds its cards in it: freed by the next pass.
        self._scheduler = None
        for replica in self._inventory.replicas():
            if replica.model not in catalog:
                served = self._catalog.get(replica.model) is not None
                why = "is now served by its endpoints" if served else "is no longer in the catalog"
                await self._stop(replica, f"{replica.model} {why}")
        # Every failure is recorded before anything is placed: the pass's placement snapshot is taken
        # at its first placement, and a model whose failure was recorded after that (a later model in
        # the catalog) was placed straight back on the node it had just failed on.
        for model in models:
            await self._replace_failed(model)
        self.scaler.forget_others(models)
        for model in models:
            await self._reconcile_model(model)
        self.scaler.after_pass(self._inventory)
        await self.scaler.save()
        live = {r.replica_id or r.shard_id for r in self._inventory.replicas()}
        for gone in [key for key in self._draining_since if key not in live]:
            del self._draining_since[gone]
        shards = {r.shard_id for r in self._inventory.replicas()}
        for gone in [shard for shard in self._retries if shard not in shards]:
            del self._retries[gone]

    async def _replace_failed(self, model: ModelConfig) -> None:
        """Stop the model's failed replicas and back off the nodes they failed on."""
        now = self._clock()
        replicas = self._inventory.replicas(model.name)
        for replica in [r for r in replicas if r.state == "failed"]:
            await self._stop(replica, f"it failed: {replica.detail}" if replica.detail else "it failed")
            self._fail(model.name, replica.node_id, now)
            # A snapshot this pass already took knows nothing of this backoff: the next placement
            # takes a new one (which counts what this pass placed, now in the inventory).
            self._scheduler = None
            # The other ranks of a multi-node replica serve nothing without this one.
            for rank in [r for r in replicas if replica.replica_id and r.replica_id == replica.replica_id]:
                if rank.state != "failed":
                    await self._stop(rank, f"rank {replica.shard_id} of its replica failed")

    async def _reconcile_model(self, model: ModelConfig) -> None:
        # A failure that arrived while this pass placed an earlier model is recorded now, before this
        # one is placed: counted as merely missing, it was started straight back on the node it had
        # just failed on, its backoff recorded only by the next pass.
        await self._replace_failed(model)
        now = self._clock()
        replicas = self._inventory.replicas(model.name)
        for r in replicas:
            if r.state == READY and (retried := self._retries.pop(r.shard_id, None)) is not None:
                # Serving again on that node: the next failure there starts from the base wait. Only a
                # retry counts: a sibling serving there all along says nothing of the failing one.
                self._backoff.pop(retried, None)
        live = [r for r in replicas if r.state != "failed" and self._on_ready_node(r)]
        # A multi-node replica is several shards, one per rank, sharing a replica id.
        groups: dict[str, list[Replica]] = {}
        for r in live:
            groups.setdefault(r.replica_id or r.shard_id, []).append(r)
        # Replicas on a draining node count as gone: their replacements start now, elsewhere.
        draining = {k: g for k, g in groups.items() if any(self._draining(r) for r in g)}
        groups = {k: g for k, g in groups.items() if k not in draining}
        await self._drain(model, draining, now)
        wanted = self.scaler.wanted(model, groups)
        why = self.scaler.reason(model.name) or f"{model.name} wants {wanted} replicas"
        for extra in self.scaler.extras(model, list(groups.values()), wanted):
            for shard in extra:
                await self._stop(shard, why)
        missing = wanted - len(groups)
        if missing <= 0:
            return
        for _ in range(missing):
            if not await self._place(model):
                await self._make_room(model)
                break

    async def _make_room(self, model: ModelConfig) -> None:
        """Stop an idle replica of another on-demand model where only room keeps model from a node.

        One per pass: the next pass's placement (which still decides where) sees the room it made,
        and stops another only if that was not enough.
        """
        if self._scheduler is None or not model.profiles:
            return
        # Nodes that fail only for what placed replicas use: labels, GPU class or an engine missing
        # there are not fixed by stopping anything.
        verdicts = [v for v in self._scheduler.explain(model) if v.kind in (CARDS, MEMORY) and not v.hard]
        if not verdicts:
            return
        catalog = {m.name: m for m in self._catalog.models()}
        # Placement counts the cards and memory of the replicas it knows: one stopped here is room
        # at once for the next snapshot.
        victim = self.scaler.victim(model, catalog, self._inventory.replicas(), {v.node for v in verdicts})
        if victim is None:
            return
        words = self.scaler.evicted(model, victim, catalog[victim[0].model])
        for shard in victim:
            await self._stop(shard, words)
        self._scheduler = None
        self._inventory.changed.set()

    async def _place(self, model: ModelConfig) -> bool:
        """Place one replica; False when there was nowhere to, and the next would find nowhere too."""
        source, pins = model.source, dict(model.sha256)
        if source.startswith(SOURCE_PREFIX):
            # Asked of the mirror at each placement, not once: a model fetched again, or deleted,
            # there is what nodes get next, and a node never gets a commit the mirror no longer has.
            try:
                if self._mirror is None:
                    raise MirrorError(
                        f"{source}: no mirror is configured (server.yaml's mirror.api and mirror.url)"
                    )
                source, pins = await self._mirror.resolve(source)
            except MirrorError as exc:
                self._inventory.set_unplaced(model.name, str(exc))
                log.warning("cannot place a replica", model=model.name, reason=str(exc))
                return False
        elif is_local(source):
            if self._local_files is None:
                why = f"{source} is on the server's disk, and this server does not serve files to nodes"
                self._inventory.set_unplaced(model.name, why)
                return False
            # The pins taken at `model add` travel with it: a file changed since is refused by the node.
            source = self._local_files.url(model)
        if self._scheduler is None:
            self._scheduler = await Scheduler.snapshot(
                self._inventory,
                self._cfg,
                [m for m in self._catalog.models() if not m.endpoints],
                self.backoff(),
                self._estimates.needs(),
            )
        placement = self._scheduler.place(model)
        if placement is None:
            self._inventory.set_unplaced(model.name, self._scheduler.why_not(model))
            if not model.profiles:
                reason = "no_profile"
            else:
                kinds = (v.kind for v in self._scheduler.explain(model) if not v.candidate)
                reason = reject_reason(kinds, "no_node")
            self._metrics.placement_failed(model.name, reason)
            return False
        profile, ranks = placement.profile, placement.ranks
        # Readable on a page, and a file name on the node: org/model's shards are org--model-….
        replica_id = f"{shard_stem(model.name)}-{uuid.uuid4().hex[:8]}"
        multi = len(ranks) > 1
        master = self._inventory.node(ranks[0].node)
        # One per replica: every rank of it is one engine as far as its callers go, and only the
        # gateway (and the control plane reading its metrics) holds it.
        secret = secrets.token_urlsafe(32)
        for number, rank in enumerate(ranks):
            start = pb.StartShard(
                shard_id=f"{replica_id}-{number}" if multi else replica_id,
                model=model.name,
                engine=profile.engine,
                args=shard_args(model, profile),
                env=dict(profile.env),
                profile=profile.name,
                source=source,
                sha256=pins,
                gpu_indices=list(rank.gpu_indices),
                engine_secret=secret,
            )
            if multi:
                start.replica_id, start.rank, start.world_size = replica_id, number, len(ranks)
                start.master_addr = master_address(master) if master is not None else ""
                start.master_port = MASTER_PORT
            try:
                await self._inventory.send(rank.node, pb.ControlMessage(start=start))
            except NodeNotConnected as exc:
                log.info("could not place a replica", model=model.name, reason=str(exc))
                return True
            self._inventory.expect(rank.node, start)
            self.scaler.placed(model.name, rank.node, start.shard_id)
            if (model.name, rank.node) in self._backoff:
                self._retries[start.shard_id] = (model.name, rank.node)
            log.info("placed a replica", model=model.name, node=rank.node, shard=start.shard_id)
        return True

    def _on_ready_node(self, replica: Replica) -> bool:
        node = self._inventory.node(replica.node_id)
        return node is not None and node.state == READY

    def needs(self) -> Needs:
        """Each (model, profile)'s estimate from its headers, as placement uses it (control/estimates.py)."""
        return self._estimates.needs()

    def backoff(self) -> dict[tuple[str, str], Backoff]:
        """(model, node) -> why the model is not placed on the node now, or some of its profiles for
        good, for placement and explain."""
        now = self._clock()
        failures = self._inventory.failures
        given_up = failures.given_up()
        out = {}
        for key in self._backoff.keys() | given_up.keys():
            count, until = self._backoff.get(key, (0, now))
            gave = given_up.get(key, {})
            if until > now or gave:
                cause = _cause(failures.last(*key))
                out[key] = Backoff(failures=count, remaining_s=until - now, cause=cause, given_up=gave)
        return out

    def _fail(self, model: str, node: str, now: float) -> None:
        # A replica that keeps failing on a node (a bad card, a full disk) would otherwise be
        # restarted there every pass, forever: the node waits base_backoff_s, twice that after
        # the next failure there, and so on, while placement tries the other nodes.
        failures, _ = self._backoff.get((model, node), (0, 0.0))
        failures += 1
        backoff = ExponentialBackoff(base_s=self._cfg.control.base_backoff_s, cap_s=MAX_BACKOFF_S)
        wait = backoff.delay(failures)
        self._backoff[(model, node)] = (failures, now + wait)
        log.info(
            "a replica failed: placing it again now on another node if one can take it, "
            "and on this node only after the wait",
            model=model,
            node=node,
            failures=failures,
            wait_s=wait,
        )

    def _draining(self, replica: Replica) -> bool:
        node = self._inventory.node(replica.node_id)
        return node is not None and node.admin_state == DRAINING

    async def _drain(self, model: ModelConfig, groups: Mapping[str, list[Replica]], now: float) -> None:
        """Stop the replicas of draining nodes once nothing is in flight there, or at the drain timeout.

        The gateway stopped sending them new requests when the node began to drain, unless
        nothing else serves the model: then they serve until a replacement is ready.
        """
        if not groups:
            return
        leaving = {r.endpoint for g in groups.values() for r in g if r.endpoint}
        others_ready = any(e not in leaving for e in self._inventory.ready_endpoints(model.name))
        timeout = self._cfg.control.drain_timeout_s
        for key, group in groups.items():
            since = self._draining_since.setdefault(key, now)
            busy = sum(self._in_flight.get(r.endpoint, 0) for r in group if r.endpoint)
            last = any(r.state == READY for r in group) and not others_ready
            node = group[0].node_id
            if now - since >= timeout:
                still = f"{busy} request(s) were still in flight" if busy else "nothing else served it"
                reason = f"node {node} is draining and {still} after {timeout:g} s (control.drain_timeout_s)"
            elif busy or last:
                continue
            else:
                reason = f"node {node} is draining and nothing is in flight there"
            for shard in group:
                await self._stop(shard, reason)
            del self._draining_since[key]

    async def _stop(self, replica: Replica, reason: str) -> None:
        log.info(
            "stopping a replica",
            model=replica.model,
            node=replica.node_id,
            shard=replica.shard_id,
            reason=reason,
        )
        # A node that is not connected has nothing to be told: if it comes back, its Register says
        # what still runs there, and the next pass stops what should not.
        with contextlib.suppress(NodeNotConnected):
            await self._inventory.send(
                replica.node_id,
                pb.ControlMessage(stop=pb.StopShard(shard_id=replica.shard_id, reason=reason)),
            )
        self._inventory.forget(replica.shard_id)


def _cause(failure: Failure | None) -> str:
    return failure.reason if failure is not None else ""


def master_address(node: Node) -> str:
    """Where the other ranks of a multi-node replica reach its rank 0 on node.

    The node's fabric_address (its management interface on the fabric) when it has one,
    else the address it advertises its engines at: both are addresses the node says are its
    own and reachable. The peer address of its stream is the last resort only (an agent too
    old to say): behind NAT, or through a proxy, that is not an address of the node at all.
    """
    if node.fabric_address:
        return node.fabric_address
    if node.advertise_address:
        return node.advertise_address
    host = node.address.rpartition(":")[0]
    return host.strip("[]")


def shard_args(model: ModelConfig, profile: ProfileConfig) -> list[str]:
    """The profile's arguments, after those that make its engine serve embeddings or rerank when the
    model does."""
    engine = ENGINES.get(profile.engine)
    if engine is None:
        return list(profile.args)
    mode = {"embeddings": engine.embedding_args, "rerank": engine.rerank_args}.get(model.kind, ())
    if not mode or mode[0] in profile.args:
        # None needed, or the profile says it itself (`--runner pooling --convert embed`): twice
        # would be refused.
        return list(profile.args)
    return [*mode, *profile.args]
