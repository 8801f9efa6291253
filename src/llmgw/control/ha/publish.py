"""The routing table every gateway of several control planes serves from, published by the leader.

Only the leader hears from agents, so only it knows which replicas are ready.
It publishes them (per model: each ready replica's endpoint, node, shard and
the secret its engine admits callers with) in `llmgw_routing` whenever they
change, with a NOTIFY; every standby LISTENs and reads the table again, and
reads it whole after every new connection, so a notification missed while
disconnected costs nothing. A standby's gateway routes from that table: clients
may use any control plane's gateway.

At a takeover the new leader knows no replica until its agents reconnect
(seconds). Until every node of the last published table has registered with it
(or `control.grace_s` has passed), it routes to that table's replicas as well
as to those it has heard of, publishes the two together so that other standbys
keep serving, and places nothing: a node not yet reconnected may be running the
very replica placement would otherwise start a second time.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Sequence

import asyncpg
import attrs
import cattrs
import structlog

from llmgw import strictjson
from llmgw.catalog import Catalog
from llmgw.control.ha.leadership import Leadership
from llmgw.control.inventory import Inventory
from llmgw.engines.registry import ENGINES
from llmgw.routes import EngineRoute

log = structlog.get_logger(__name__)

CHANNEL = "llmgw_routing"
# Changes closer together than this are published as one: a fleet registering at once is one write.
COALESCE_S = 0.05

_PUBLISH = """
INSERT INTO llmgw_routing (id, leader, generation, routes, published_at) VALUES (1, $1, 1, $2, now())
ON CONFLICT (id) DO UPDATE SET leader = $1, generation = llmgw_routing.generation + 1, routes = $2,
    published_at = now()
RETURNING generation
"""
_READ = "SELECT leader, generation, routes FROM llmgw_routing WHERE id = 1"

_CONVERTER = cattrs.Converter()


@attrs.frozen
class Published:
    """One ready replica as a gateway needs it."""

    endpoint: str
    node_id: str
    shard_id: str
    secret: str = attrs.field(repr=False)
    # Its engine (registry.py's name), so that a standby's gateway knows which APIs it speaks itself;
    # "" in a table an older leader published: every API is then sent as it came.
    engine: str = ""


@attrs.frozen
class RoutingTable:
    """What the leader publishes: ready replicas by model, and why each other model has none."""

    ready: dict[str, list[Published]] = attrs.field(factory=dict)
    why: dict[str, str] = attrs.field(factory=dict)
    # Nodes whose agent the leader lost: requests in flight to their engines are abandoned once the
    # leader takes those out of routing too (their engines stopped answering its gateway).
    unreachable: list[str] = attrs.field(factory=list)
    # Replicas (by shard id) whose node reported them stalled or failed, with why: what a standby's
    # gateway has in flight there ends at once, as on the leader (a stall is often failed, its engine
    # killed, by the time the table is published).
    given_up: dict[str, str] = attrs.field(factory=dict)

    def nodes(self) -> set[str]:
        return {p.node_id for replicas in self.ready.values() for p in replicas}

    def to_text(self) -> str:
        return strictjson.dumps(_CONVERTER.unstructure(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> RoutingTable:
        return _CONVERTER.structure(json.loads(text), cls)


def inventory_table(inventory: Inventory, models: Sequence[str]) -> RoutingTable:
    """The leader's own table, from what its agents reported."""
    names = sorted({*models, *(r.model for r in inventory.replicas())})
    ready: dict[str, list[Published]] = {}
    why: dict[str, str] = {}
    for model in names:
        published = []
        for endpoint in inventory.ready_endpoints(model):
            replica = inventory.endpoint_replica(endpoint)
            if replica is not None:
                secret = inventory.engine_secret(replica.shard_id)
                published.append(
                    Published(endpoint, replica.node_id, replica.shard_id, secret, replica.engine)
                )
        if published:
            ready[model] = published
        else:
            why[model] = inventory.why_no_ready(model)
    unreachable = sorted(n.id for n in inventory.nodes() if n.state == "unreachable")
    return RoutingTable(ready=ready, why=why, unreachable=unreachable, given_up=inventory.given_up())


class FleetRoutes:
    """The gateway's replica table (gateway/router.py's ReplicaTable) on a server sharing PostgreSQL.

    While this server leads and has settled, it is the inventory's; while it is
    a standby, the leader's published table; in between, both (see the module).
    """

    def __init__(
        self,
        inventory: Inventory,
        leadership: Leadership,
        catalog: Catalog,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inventory = inventory
        self._leadership = leadership
        self._catalog = catalog
        self._grace_s = grace_s
        self._clock = clock
        # The leader's last publication as read here, and its generation (0: none read yet).
        self.published = RoutingTable()
        self.generation = 0
        self.read = asyncio.Event()
        # Set once the table has been looked at, whether one was published or not: a server starting
        # beside a leader (a roll, docs/operations.md "Upgrading") listens only then, or its gateway
        # would answer "no ready replica" to the clients a load balancer sends it at once.
        self.looked = asyncio.Event()
        # The table as it stood when this server took the lead, while it settles; None once settled.
        self._takeover: RoutingTable | None = None
        # The leadership's term in which this server settled: from the moment it takes the lead until
        # then, the takeover's table is served as well (even before lead() has started).
        self._settled_term = 0
        # Endpoints this gateway could not connect to, until the next publication or a grace.
        self._refused: dict[str, float] = {}
        # shard id -> (its node, the signal its requests in flight listen to).
        self._lost: dict[str, tuple[str, asyncio.Future[str]]] = {}
        self._view: tuple[object, dict[str, tuple[str, ...]], dict[str, Published]] | None = None
        self._dirty = asyncio.Event()
        leadership.on_connect(self._listen)

    # --- the gateway's side (ReplicaTable)

    def _own(self) -> bool:
        """Whether the inventory alone is the table: leading and settled."""
        return self._leadership.leading and self._settled_term == self._leadership.term

    def ready_endpoints(self, model: str) -> Sequence[str]:
        if self._own():
            return self._inventory.ready_endpoints(model)
        return self._current()[0].get(model, ())

    def why_no_ready(self, model: str) -> str:
        if self._leadership.leading:
            return self._inventory.why_no_ready(model)
        said = self.published.why.get(model)
        if said:
            return said
        leader = self._leadership.leader
        by = f"the leader, {leader.name}," if leader is not None else "the leader"
        return f"{model} has no ready replica that {by} has published"

    def route(self, endpoint: str) -> EngineRoute | None:
        if self._own():
            return self._inventory.route(endpoint)
        if self._leadership.leading and self._inventory.endpoint_replica(endpoint) is not None:
            return self._inventory.route(endpoint)
        published = self._current()[1].get(endpoint)
        if published is None:
            return None
        engine = ENGINES.get(published.engine)
        return EngineRoute(
            node_id=published.node_id,
            shard_id=published.shard_id,
            secret=published.secret,
            lost=self._lost_signal(published),
            refused=lambda reason: self._refuse(endpoint, reason),
            native_apis=engine.native_apis if engine is not None else None,
        )

    def _current(self) -> tuple[dict[str, tuple[str, ...]], dict[str, Published]]:
        now = self._clock()
        expired = [e for e, since in self._refused.items() if now - since >= self._grace_s]
        for endpoint in expired:
            del self._refused[endpoint]
        leading = self._leadership.leading
        settling = leading and not self._own()
        takeover = self._takeover if self._takeover is not None else self.published
        key = (settling, self.generation, self._inventory.version, len(self._refused), id(takeover))
        if self._view is not None and self._view[0] == key:
            return self._view[1], self._view[2]
        table = self.published
        by_model: dict[str, list[str]] = {}
        by_endpoint: dict[str, Published] = {}
        if settling:
            table = takeover
            for model in {*self._catalog.names(), *table.ready}:
                by_model[model] = list(self._inventory.ready_endpoints(model))
            registered = {n.id for n in self._inventory.nodes() if n.connected}
            table = RoutingTable(
                ready={m: [p for p in ps if p.node_id not in registered] for m, ps in takeover.ready.items()}
            )
        for model, replicas in table.ready.items():
            for p in replicas:
                if p.endpoint in self._refused:
                    continue
                by_model.setdefault(model, []).append(p.endpoint)
                by_endpoint[p.endpoint] = p
        ready = {m: tuple(dict.fromkeys(e)) for m, e in by_model.items() if e}
        self._view = (key, ready, by_endpoint)
        return ready, by_endpoint

    def _refuse(self, endpoint: str, reason: str) -> None:
        if endpoint not in self._refused:
            log.warning(
                "an engine refused this gateway; it is not routed to until the leader publishes again",
                endpoint=endpoint,
                reason=reason,
            )
        self._refused[endpoint] = self._clock()

    def _lost_signal(self, published: Published) -> asyncio.Future[str]:
        kept = self._lost.get(published.shard_id)
        if kept is None or kept[1].done():
            kept = self._lost[published.shard_id] = (
                published.node_id,
                asyncio.get_running_loop().create_future(),
            )
        return kept[1]

    # --- the leader's side

    def table(self) -> RoutingTable:
        """What this leader publishes: its inventory's table, and while it settles, the takeover's too."""
        own = inventory_table(self._inventory, self._catalog.names())
        if self._own():
            return own
        ready, by_endpoint = self._current()
        merged = {m: [by_endpoint[e] for e in es if e in by_endpoint] for m, es in ready.items()}
        for model, replicas in own.ready.items():
            known = {p.endpoint for p in merged.get(model, [])}
            merged.setdefault(model, []).extend(p for p in replicas if p.endpoint not in known)
        merged = {m: ps for m, ps in merged.items() if ps}
        why = {m: s for m, s in own.why.items() if m not in merged}
        return RoutingTable(ready=merged, why=why, unreachable=own.unreachable)

    async def lead(self) -> None:
        """From a takeover until every node of the last table has registered (or grace_s): serve both."""
        term = self._leadership.term
        self._takeover = self.published
        waiting = self._takeover.nodes()
        log.info(
            "taking over: serving the last published routing table until its nodes reconnect",
            nodes=len(waiting),
            replicas=sum(len(r) for r in self._takeover.ready.values()),
            within_s=self._grace_s,
        )
        deadline = self._clock() + self._grace_s
        try:
            while waiting and self._clock() < deadline:
                connected = {n.id for n in self._inventory.nodes() if n.connected}
                waiting -= connected
                if waiting:
                    await asyncio.sleep(0.1)
            self._settled_term = term
        finally:
            self._takeover = None
            self._view = None
        if waiting:
            log.warning(
                "nodes of the last routing table did not reconnect to the new leader",
                nodes=sorted(waiting),
                within_s=self._grace_s,
            )

    async def publish(self) -> None:
        """Publish the table whenever it changes; until cancelled (this server stops leading)."""
        last: RoutingTable | None = None
        changed = self._inventory.routes_changed
        while True:
            changed.clear()
            table = self.table()
            if table != last:
                publish = functools.partial(_publish, leader=self._leadership.name, text=table.to_text())
                try:
                    generation = await self._leadership.use(publish)
                except (OSError, asyncpg.PostgresError, TimeoutError, ConnectionError) as exc:
                    # The lock's connection is failing: the leadership notices and steps down, or it
                    # recovers and the next change (or this one, retried) is published.
                    log.warning("could not publish the routing table", error=str(exc) or type(exc).__name__)
                    await asyncio.sleep(0.5)
                    changed.set()
                    continue
                last = table
                # What this server published is its table from now, not once it has read it back: a
                # leader that steps down first (PostgreSQL gone) routes by it instead of an older one.
                if generation > self.generation:
                    self._apply(table, generation)
                log.debug("published the routing table", generation=generation)
            try:
                # While settling the merge changes as nodes reconnect: look again now and then.
                async with asyncio.timeout(None if self._own() else 0.5):
                    await changed.wait()
            except TimeoutError:
                pass
            await asyncio.sleep(COALESCE_S)

    # --- every server's side: following the leader's publications

    async def _listen(self, connection: asyncpg.Connection) -> None:
        await connection.add_listener(CHANNEL, self._notified)
        # Whatever was published while this server had no connection.
        self._dirty.set()

    def _notified(self, connection: object, pid: int, channel: str, payload: object) -> None:
        self._dirty.set()

    async def follow(self) -> None:
        """Read the table again on every notification; until cancelled."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                row = await self._leadership.use(lambda c: c.fetchrow(_READ))
            except (OSError, asyncpg.PostgresError, TimeoutError, ConnectionError) as exc:
                # The next connection marks the table to be read again.
                log.warning("could not read the routing table", error=str(exc) or type(exc).__name__)
                continue
            if row is not None and row["generation"] != self.generation:
                self._read_row(row)
            self.looked.set()

    async def first_look(self, timeout_s: float) -> bool:
        """Wait until the table was looked at once (found or not); False when timeout_s passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.looked.wait()
        except TimeoutError:
            return False
        return True

    def _read_row(self, row: asyncpg.Record) -> None:
        try:
            table = RoutingTable.from_text(row["routes"])
        except (ValueError, cattrs.BaseValidationError) as exc:
            log.error("the published routing table cannot be read", error=str(exc))
            return
        self._apply(table, row["generation"])

    def _apply(self, table: RoutingTable, generation: int) -> None:
        self.published = table
        self.generation = generation
        # A new publication is the leader's word on every endpoint: refusals here start over.
        self._refused.clear()
        self._view = None
        # An agent lost alone abandons nothing: its engines serve on while they answer the leader's
        # gateway. Once the leader takes one out too, nobody will close what is in flight there.
        routed = {p.shard_id for ps in table.ready.values() for p in ps}
        unreachable = set(table.unreachable)
        for shard_id, (node, future) in list(self._lost.items()):
            if shard_id in routed:
                continue
            why = table.given_up.get(shard_id)
            if why is None and node in unreachable:
                why = f"node {node}'s agent is unreachable and its engine stopped answering the leader"
            if why is not None:
                del self._lost[shard_id]
                if not future.done():
                    future.set_result(why)
        self.read.set()
        log.debug("read the routing table", generation=generation, models=len(table.ready))


async def _publish(connection: asyncpg.Connection, leader: str, text: str) -> int:
    async with connection.transaction():
        generation = int(await connection.fetchval(_PUBLISH, leader, text))
        await connection.execute("SELECT pg_notify($1, $2)", CHANNEL, str(generation))
    return generation
