"""Rolling the agents to another release, a few nodes at a time (docs/operations.md, "Upgrading").

The control plane holds the release's digest and sends each chosen node an Upgrade
(agent/upgrade.py); the node installs the release beside the running one and restarts into
it, adopting its engines. The roll takes `max_unavailable` nodes at a time and waits for each
to come back at the new version before the next: a node that refuses the release or rolls
back stops the roll there, saying why, so that one bad release costs one node's restart and
not the fleet's.
"""

from __future__ import annotations

import asyncio
import time

import attrs
import structlog

import llmgw
from llmgw.adminapi import views
from llmgw.control.inventory import Inventory, NodeNotConnected
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb
from llmgw.versions import refusal

log = structlog.get_logger(__name__)

# How often a roll looks at the nodes it waits for.
_POLL_S = 0.2
# Beyond the trial, how long a node may take to fetch, install and restart.
_INSTALL_BOUND_S = 600.0


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
class _Step:
    node: str
    from_version: str
    state: str = "waiting"
    detail: str = ""
    started: float | None = None
    finished: float | None = None

    def view(self) -> views.UpgradeNode:
        took = None
        if self.started is not None:
            took = round((self.finished or time.monotonic()) - self.started, 1)
        return views.UpgradeNode(
            node=self.node, from_version=self.from_version, state=self.state, detail=self.detail, seconds=took
        )


@attrs.define
class _Roll:
    order: Order
    steps: list[_Step]
    dry_run: bool
    state: str = "running"
    detail: str = ""
    started: float = attrs.field(factory=time.monotonic)
    finished: float | None = None

    def view(self) -> views.Upgrade:
        return views.Upgrade(
            version=self.order.version,
            state=self.state,
            detail=self.detail,
            dry_run=self.dry_run,
            max_unavailable=self.order.max_unavailable,
            seconds=round((self.finished or time.monotonic()) - self.started, 1),
            nodes=[step.view() for step in self.steps],
        )


class Upgrades:
    """The roll under way, or the last one; run() is the owned task that carries rolls out."""

    def __init__(self, inventory: Inventory, server_version: str = llmgw.__version__) -> None:
        self._inventory = inventory
        self._server_version = server_version
        self._roll: _Roll | None = None
        self._queue: asyncio.Queue[_Roll] = asyncio.Queue()

    def view(self) -> views.Upgrade | None:
        return self._roll.view() if self._roll is not None else None

    def start(self, order: Order, *, dry_run: bool = False) -> views.Upgrade:
        """Plan a roll to order.version and, unless dry_run, start it; UpgradeRefused says why not."""
        if self._roll is not None and self._roll.state == "running":
            raise UpgradeRefused(
                f"an upgrade to {self._roll.order.version} is under way; "
                "wait for it (`llmgw ctl upgrade status`)"
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
        roll = _Roll(order, self._plan(order), dry_run)
        if dry_run:
            roll.state, roll.finished = "planned", roll.started
        else:
            self._queue.put_nowait(roll)
        self._roll = roll
        return roll.view()

    def _plan(self, order: Order) -> list[_Step]:
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
            step = _Step(node_id, node.agent_version)
            if node.agent_version == order.version:
                step.state, step.detail = "upgraded", f"already runs {order.version}"
            elif not node.connected:
                step.state, step.detail = "skipped", "not connected: upgrade it once it is back"
            steps.append(step)
        return steps

    async def run(self) -> None:
        while True:
            roll = await self._queue.get()
            await self._carry_out(roll)

    async def _carry_out(self, roll: _Roll) -> None:
        log.info("rolling the agents", version=roll.order.version, nodes=[s.node for s in roll.steps])
        waiting = [s for s in roll.steps if s.state == "waiting"]
        size = roll.order.max_unavailable
        for at in range(0, len(waiting), size):
            batch = waiting[at : at + size]
            await asyncio.gather(*(self._one(roll.order, step) for step in batch))
            failed = [s for s in batch if s.state != "upgraded"]
            if failed:
                for step in waiting[at + size :]:
                    step.state, step.detail = "skipped", "the roll stopped before this node"
                first = failed[0]
                roll.state = "stopped"
                roll.detail = f"stopped at {first.node}: {first.state}: {first.detail}"
                break
        else:
            roll.state = "done"
        roll.finished = time.monotonic()
        log.info("the roll ended", version=roll.order.version, state=roll.state, detail=roll.detail)

    async def _one(self, order: Order, step: _Step) -> None:
        step.started = time.monotonic()
        step.state, step.detail = "upgrading", "asked"
        self._inventory.upgrade_status(step.node, None)
        message = pb.Upgrade(
            version=order.version,
            url=order.url,
            sha256=order.sha256,
            find_links=order.find_links,
            trial_s=order.trial_s,
            index_url=order.index_url,
        )
        try:
            await self._inventory.send(step.node, pb.ControlMessage(upgrade=message))
        except NodeNotConnected as exc:
            step.state, step.detail = "failed", str(exc)
        else:
            await self._wait_for(order, step, step.started + order.trial_s + _INSTALL_BOUND_S)
        step.finished = time.monotonic()
        log.info("a node's upgrade ended", node=step.node, state=step.state, detail=step.detail)

    async def _wait_for(self, order: Order, step: _Step, deadline: float) -> None:
        """Until the node runs order.version and is connected, or says why it does not."""
        while time.monotonic() < deadline:
            node = self._inventory.node(step.node)
            said = node.upgrade if node is not None else None
            if said is not None and said.version == order.version:
                step.detail = said.detail
                if said.state in ("refused", "rolled back"):
                    step.state = said.state
                    return
            if node is not None and node.connected and node.agent_version == order.version:
                step.state = "upgraded"
                return
            await asyncio.sleep(_POLL_S)
        step.state = "failed"
        step.detail = (
            f"did not come back at {order.version} within {deadline - (step.started or 0):.0f} s "
            f"(last said: {step.detail})"
        )
