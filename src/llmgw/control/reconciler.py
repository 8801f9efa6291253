"""Keeps the replicas of every catalog model running: places missing ones, replaces failed ones.

Placement here is the minimal one of the walking skeleton: a model's first
profile that some ready node can run, on the node with fewest replicas. The
real scheduler (GPUs, memory, labels, explanations per node) replaces
`_place` without changing the loop around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Sequence

import structlog

from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import READY, Inventory, NodeNotConnected, Replica
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 300.0


class Reconciler:
    """Compares the catalog with the inventory every control.interval_s, or sooner when something changes."""

    def __init__(self, cfg: ServerConfig, inventory: Inventory) -> None:
        self._cfg = cfg
        self._inventory = inventory
        # model -> (loop time before which it is not placed again, the wait after its next failure)
        self._backoff: dict[str, tuple[float, float]] = {}

    async def run(self) -> None:
        """Reconcile until cancelled."""
        changed = self._inventory.changed
        while True:
            changed.clear()
            try:
                await self.reconcile()
            except Exception:
                # A bug in one pass must not stop every later one; the next pass starts from the inventory.
                log.exception("reconcile pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self._cfg.control.interval_s)

    async def reconcile(self) -> None:
        """One pass over the catalog."""
        catalog = {m.name: m for m in self._cfg.models}
        for replica in self._inventory.replicas():
            if replica.model not in catalog:
                await self._stop(replica, f"{replica.model} is no longer in the catalog")
        for model in self._cfg.models:
            await self._reconcile_model(model)

    async def _reconcile_model(self, model: ModelConfig) -> None:
        now = asyncio.get_running_loop().time()
        replicas = self._inventory.replicas(model.name)
        for replica in [r for r in replicas if r.state == "failed"]:
            await self._stop(replica, f"it failed: {replica.detail}" if replica.detail else "it failed")
            self._fail(model.name, now)
        if any(r.state == READY for r in replicas):
            self._backoff.pop(model.name, None)
        live = [r for r in replicas if r.state != "failed" and self._on_ready_node(r)]
        for extra in sorted(live, key=lambda r: r.state == READY)[model.replicas :]:
            await self._stop(extra, f"{model.name} wants {model.replicas} replicas")
        missing = model.replicas - len(live)
        if missing <= 0:
            return
        until, _ = self._backoff.get(model.name, (0.0, 0.0))
        if now < until:
            self._inventory.set_unplaced(
                model.name, f"its replicas keep failing; the next try is in {until - now:.0f} s"
            )
            return
        for _ in range(missing):
            await self._place(model)

    async def _place(self, model: ModelConfig) -> None:
        choice = self._choose(model.profiles)
        if isinstance(choice, str):
            self._inventory.set_unplaced(model.name, choice)
            return
        profile, node_id = choice
        start = pb.StartShard(
            shard_id=f"{model.name}-{uuid.uuid4().hex[:8]}",
            model=model.name,
            engine=profile.engine,
            args=list(profile.args),
            env=dict(profile.env),
            profile=profile.name,
        )
        try:
            await self._inventory.send(node_id, pb.ControlMessage(start=start))
        except NodeNotConnected as exc:
            log.info("could not place a replica", model=model.name, reason=str(exc))
            return
        self._inventory.expect(node_id, start)
        log.info("placed a replica", model=model.name, node=node_id, shard=start.shard_id)

    def _choose(self, profiles: Sequence[ProfileConfig]) -> tuple[ProfileConfig, str] | str:
        """The profile and node to start a replica on, or why there is none."""
        nodes = [n for n in self._inventory.nodes() if n.state == READY and n.connected]
        if not nodes:
            return "no node can run it (no node is connected)"
        if not profiles:
            return "no node can run it (it has no profile)"
        load = Counter(r.node_id for r in self._inventory.replicas())
        for profile in profiles:
            able = [n.id for n in nodes if profile.engine in n.engine_versions]
            if able:
                return profile, min(able, key=lambda node_id: (load[node_id], node_id))
        engines = " or ".join(dict.fromkeys(p.engine for p in profiles))
        return f"no node can run it (no node has the {engines} engine)"

    def _on_ready_node(self, replica: Replica) -> bool:
        node = self._inventory.node(replica.node_id)
        return node is not None and node.state == READY

    def _fail(self, model: str, now: float) -> None:
        # The first failure is replaced at once; a model that keeps failing would otherwise be
        # restarted every pass, forever, so each further failure waits twice as long.
        _, wait = self._backoff.get(model, (0.0, 0.0))
        following = min(wait * 2, MAX_BACKOFF_S) if wait else self._cfg.control.base_backoff_s
        self._backoff[model] = (now + wait, following)

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
