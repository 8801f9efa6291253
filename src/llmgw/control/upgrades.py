"""Rolling the agents to another release, a few nodes at a time (docs/operations.md, "Upgrading").

The control plane holds the release's digest and sends each chosen node an Upgrade
(agent/upgrade.py); the node installs the release beside the running one and restarts into
it, adopting its engines. The roll takes `max_unavailable` nodes at a time and waits for each
to come back at the new version before the next: a node that refuses the release or rolls
back stops the roll there, saying why, so that one bad release costs one node's restart and
not the fleet's.

Only the leader rolls (run() is leader's work: roles/server.py). The roll is kept in the store at
each change (store/upgrades.py): a control plane that takes the lead carries a roll under way on
from where it stood, waiting again for the nodes that were asked, rather than forgetting it while
each node finished its own upgrade. Its times are wall-clock for the same reason. The admin API
projects it (adminapi/upgrades.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import attrs
import cattrs
import structlog

import llmgw
from llmgw import strictjson
from llmgw.control.inventory import Inventory, NodeNotConnected
from llmgw.errors import LlmgwError, StoreError
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store
from llmgw.store.upgrades import keep_roll, last_roll
from llmgw.versions import refusal

log = structlog.get_logger(__name__)

# How often a roll looks at the nodes it waits for.
_POLL_S = 0.2
# Beyond the trial, how long a node may take to fetch, install and restart.
_INSTALL_BOUND_S = 600.0
# How long a node asked by an earlier leader has, at the least, to register with this one.
_RECONNECT_S = 60.0


_ONE_SOURCE = (
    "the release comes from the wheel or from the package index, not both: an index URL is for a roll "
    "without a wheel (dependencies a wheel lacks come from a wheelhouse, find links)"
)


class UpgradeRefused(LlmgwError):
    """A roll that cannot start, in words for a person."""


@attrs.frozen
class Order:
    """What `llmgw ctl upgrade` asks for."""

    version: str
    # Empty: llmgw version's wheel from the package index (index_url, or each node's own).
    url: str
    sha256: str
    nodes: tuple[str, ...] = ()
    max_unavailable: int = 1
    find_links: str = ""
    trial_s: int = 60
    index_url: str = ""


@attrs.define
class Step:
    """One node of a roll: where its upgrade stands, and when it began and ended (time.time())."""

    node: str
    from_version: str
    state: str = "waiting"
    detail: str = ""
    started: float | None = None
    finished: float | None = None


@attrs.define
class Roll:
    """A roll of the agents to order.version: planned, under way or ended; times are time.time()."""

    order: Order
    steps: list[Step]
    dry_run: bool
    state: str = "running"
    detail: str = ""
    started: float = attrs.field(factory=time.time)
    finished: float | None = None

    def to_json(self) -> str:
        return strictjson.dumps(_CONVERTER.unstructure(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Roll:
        return _CONVERTER.structure(json.loads(text), cls)


_CONVERTER = cattrs.Converter()


class Upgrades:
    """The roll under way, or the last one; run() is the leader's task that carries rolls out.

    standby says why this control plane may not start a roll (a standby's sentence naming the
    leader), or None while it leads.
    """

    def __init__(
        self,
        inventory: Inventory,
        store: Store,
        standby: Callable[[], str | None],
        server_version: str = llmgw.__version__,
    ) -> None:
        self._inventory = inventory
        self._store = store
        self._standby = standby
        self._server_version = server_version
        # The roll this control plane carries out as the leader; None while it does not lead.
        self._roll: Roll | None = None
        self._queue: asyncio.Queue[Roll] = asyncio.Queue()
        self._keeping = asyncio.Lock()

    async def last(self) -> Roll | None:
        """The roll under way or the last one: this leader's own, else the store's (on a standby)."""
        if self._roll is not None:
            return self._roll
        return await self._stored()

    async def _stored(self) -> Roll | None:
        """The roll the store keeps; None when there is none, or none this release can read."""
        text = await last_roll(self._store)
        if text is None:
            return None
        try:
            return Roll.from_json(text)
        except (ValueError, cattrs.BaseValidationError) as exc:
            log.warning("the roll kept in the store cannot be read; it is left", error=str(exc))
            return None

    async def start(self, order: Order, *, dry_run: bool = False) -> Roll:
        """Plan a roll to order.version and, unless dry_run, start it; UpgradeRefused says why not."""
        standby = self._standby()
        if standby is not None:
            # A standby places nothing and reaches no node: the leader holds the agents.
            raise UpgradeRefused(f"{standby}: run `llmgw ctl upgrade` against the leader")
        # This leader's own: run() took the store's roll under way into it as the leadership came.
        last = self._roll
        if last is not None and last.state == "running":
            raise UpgradeRefused(
                f"an upgrade to {last.order.version} is under way; wait for it (`llmgw ctl upgrade status`)"
            )
        if order.max_unavailable < 1:
            raise UpgradeRefused("--max-unavailable must be at least 1")
        if not order.sha256:
            # Whatever the release's source, the digest is what every node holds it to.
            raise UpgradeRefused(f"give the sha256 of llmgw {order.version}'s wheel: every node checks it")
        if order.url and order.index_url:
            raise UpgradeRefused(_ONE_SOURCE)
        why = refusal(order.version, self._server_version)
        if why is not None:
            raise UpgradeRefused(f"this control plane would refuse the agents it asks for: {why}")
        roll = Roll(order, self._plan(order), dry_run)
        self._roll = roll
        if dry_run:
            # Shown by `upgrade status` here, never kept: a plan is no roll for the next leader.
            roll.state, roll.finished = "planned", roll.started
        else:
            await self._keep(roll)
            self._queue.put_nowait(roll)
        return roll

    def _plan(self, order: Order) -> list[Step]:
        known = {node.id: node for node in self._inventory.nodes()}
        unknown = [n for n in order.nodes if n not in known]
        if unknown:
            raise UpgradeRefused(
                f"no node called {', '.join(unknown)} has registered with this control plane"
            )
        chosen = list(order.nodes) or sorted(known)
        if not chosen:
            raise UpgradeRefused("no node has registered with this control plane")
        steps = []
        for node_id in chosen:
            node = known[node_id]
            step = Step(node_id, node.agent_version)
            if node.agent_version == order.version:
                step.state, step.detail = "upgraded", f"already runs {order.version}"
            elif not node.connected:
                step.state, step.detail = "skipped", "not connected: upgrade it once it is back"
            steps.append(step)
        return steps

    async def run(self) -> None:
        """The leader's work: carry on the roll the store holds under way, then each roll started."""
        try:
            try:
                stored = await self._stored()
            except (StoreError, OSError) as exc:
                # Rolls asked of this leader are carried out all the same.
                log.warning("could not read the roll kept in the store", error=str(exc))
                stored = None
            # Unless a roll was asked of this leader while the store answered: that one is newer.
            if stored is not None and self._roll is None:
                self._roll = stored
                if stored.state == "running":
                    log.info("carrying on the roll left under way", version=stored.order.version)
                    await self._carry_out(stored)
            while True:
                roll = await self._queue.get()
                self._roll = roll
                await self._carry_out(roll)
        finally:
            # No longer the leader: the next one carries the roll on from the store.
            self._roll = None

    async def _keep(self, roll: Roll) -> None:
        """Write the roll to the store; a store that fails costs the next leader its state, not the roll."""
        try:
            # One write at a time, each of the roll as it is then: two writes in flight (the start's
            # and its first node's) could land in either order, and the older state stay kept.
            async with self._keeping:
                await keep_roll(self._store, roll.to_json())
        except (StoreError, OSError) as exc:
            log.warning("could not keep the roll in the store", error=str(exc))

    async def _carry_out(self, roll: Roll) -> None:
        log.info("rolling the agents", version=roll.order.version, nodes=[s.node for s in roll.steps])
        # Those asked by a leader before this one are waited for again, not asked twice.
        asked = [s for s in roll.steps if s.state == "upgrading"]
        if asked:
            await asyncio.gather(*(self._one(roll, step, ask=False) for step in asked))
        waiting = [s for s in roll.steps if s.state == "waiting"]
        if not self._stop_at_failure(roll, asked, waiting):
            size = roll.order.max_unavailable
            for at in range(0, len(waiting), size):
                batch = waiting[at : at + size]
                await asyncio.gather(*(self._one(roll, step) for step in batch))
                if self._stop_at_failure(roll, batch, waiting[at + size :]):
                    break
            else:
                roll.state = "done"
        roll.finished = time.time()
        await self._keep(roll)
        log.info("the roll ended", version=roll.order.version, state=roll.state, detail=roll.detail)

    @staticmethod
    def _stop_at_failure(roll: Roll, batch: list[Step], after: list[Step]) -> bool:
        """Whether a node of batch did not upgrade: then the roll stops, and the nodes after are skipped."""
        failed = [s for s in batch if s.state != "upgraded"]
        if not failed:
            return False
        for step in after:
            step.state, step.detail = "skipped", "the roll stopped before this node"
        first = failed[0]
        roll.state = "stopped"
        roll.detail = f"stopped at {first.node}: {first.state}: {first.detail}"
        return True

    async def _one(self, roll: Roll, step: Step, *, ask: bool = True) -> None:
        order = roll.order
        if ask:
            step.started = time.time()
            step.state, step.detail = "upgrading", "asked"
            self._inventory.upgrade_status(step.node, None)
            await self._keep(roll)
        message = pb.Upgrade(
            version=order.version,
            url=order.url,
            sha256=order.sha256,
            find_links=order.find_links,
            trial_s=order.trial_s,
            index_url=order.index_url,
        )
        try:
            if ask:
                await self._inventory.send(step.node, pb.ControlMessage(upgrade=message))
        except NodeNotConnected as exc:
            step.state, step.detail = "failed", str(exc)
        else:
            started = step.started if step.started is not None else time.time()
            deadline = started + order.trial_s + _INSTALL_BOUND_S
            if not ask:
                # Asked by an earlier leader, maybe long ago: its agent needs a moment to find this one.
                deadline = max(deadline, time.time() + _RECONNECT_S)
            await self._wait_for(roll, step, deadline)
        step.finished = time.time()
        await self._keep(roll)
        log.info("a node's upgrade ended", node=step.node, state=step.state, detail=step.detail)

    async def _wait_for(self, roll: Roll, step: Step, deadline: float) -> None:
        """Until the node runs the roll's version and is connected, or says why it does not."""
        order = roll.order
        while time.time() < deadline:
            node = self._inventory.node(step.node)
            said = node.upgrade if node is not None else None
            if node is not None and node.connected and node.agent_version == order.version:
                # The control plane's own words: the agent's last ("restarting into …") is stale
                # now, and its own count of seconds is not the one TOOK says.
                step.state, step.detail = "upgraded", f"registered running {order.version}"
                return
            if said is not None and said.version == order.version:
                if said.state in ("refused", "rolled back"):
                    step.state, step.detail = said.state, said.detail
                    return
                if said.detail != step.detail:
                    step.detail = said.detail
                    await self._keep(roll)
            await asyncio.sleep(_POLL_S)
        step.state = "failed"
        step.detail = (
            f"did not come back at {order.version} within {deadline - (step.started or 0):.0f} s "
            f"(last said: {step.detail})"
        )
