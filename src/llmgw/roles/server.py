"""The server role: store, inventory, agent service, reconciler and gateway.

Built in dependency order and torn down in reverse by one exit stack: the
gateway stops taking requests first (in-flight ones finish within the drain
timeout), then the reconciler, the agent service and finally the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import attrs
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmgw import bound, config, heap, openfiles
from llmgw.adminapi import views
from llmgw.adminapi.handlers import BACKOFF_KEY, BUDGETS_KEY, CONTROL_PLANE_KEY, NEEDS_KEY, PRICES_KEY
from llmgw.adminapi.scaling import SCALER_KEY
from llmgw.adminapi.upgrades import UPGRADES_KEY
from llmgw.bodies import SERVER_OPTIONS
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.config.database import is_postgres_url
from llmgw.control.engine_checks import EngineChecks
from llmgw.control.ha.leadership import Leadership, advertised, plane_name, while_leading
from llmgw.control.ha.publish import FleetRoutes
from llmgw.control.inventory import Inventory
from llmgw.control.localfiles import LocalFiles, serve_local_files
from llmgw.control.metrics import ControlMetrics
from llmgw.control.mirror import MirrorClient
from llmgw.control.reconciler import Reconciler
from llmgw.control.scaling import Scaler
from llmgw.control.stream.service import free_port, serve_agents
from llmgw.control.upgrades import Upgrades
from llmgw.errors import StoreError
from llmgw.gateway.admission import Admission
from llmgw.gateway.allowance import Allowance
from llmgw.gateway.app import COLD_STARTS_KEY, ROUTER_KEY, make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.endpoints import ENDPOINTS_KEY, Endpoints
from llmgw.gateway.errors import unreadable
from llmgw.gateway.history import History
from llmgw.gateway.journal import Entry, Journal, open_journal
from llmgw.gateway.metrics import GatewayMetrics, budget_families
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.httpserver import ListenerRunner, Refusal
from llmgw.listen import cannot_listen, split_host_port
from llmgw.metrics import Metrics, Snapshot, new_registry, serve_metrics
from llmgw.pricing import budget_warnings
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key, find_key
from llmgw.store.postgres import PostgresStore
from llmgw.web import admin_listener
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.client_port import mount_client_port
from llmgw.web.context import WebContext
from llmgw.web.history import HISTORY_KEY

log = structlog.get_logger(__name__)

# Revoking a key must take effect within a second.
_KEY_REFRESH_S = 0.5
# Limits, budgets, prices and the hierarchy, changed on a page, by a command or the admin API,
# bind within a second.
_QUOTA_REFRESH_S = 1.0
# A model added on another control plane sharing the store is served and placed within a second.
_CATALOG_REFRESH_S = 1.0
# How long a server sharing PostgreSQL waits, before its gateway listens, to read the leader's routing
# table once: the leadership's connection is made within 5 s (control/ha/leadership.py), and a server
# whose PostgreSQL is away still starts, saying so, rather than hang.
_FIRST_LOOK_S = 10.0


@attrs.define
class ServerHandle:
    gateway_url: str
    agent_port: int
    store: Store
    keys: KeyCache
    inventory: Inventory
    # Limits, budgets and their spending as the gateway counts them; usage not yet written.
    quotas: Quotas | None = None
    usage: UsageRecorder | None = None
    # The admin listener: cluster pages and the admin API, for this machine (`llmgw ctl`).
    admin_url: str = ""
    # metrics_listen's URL; "" when it is not set.
    metrics_url: str = ""

    async def create_dev_key(self) -> str:
        """A fresh key for the dev banner, usable at once."""
        plaintext, _ = await create_key(self.store, "dev")
        await self.keys.refresh(self.store)
        return plaintext


async def _refresh_keys(
    store: Store, keys: KeyCache, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> None:
    # `sleep` is a seam: a test proves the interval and the reload without waiting on a clock.
    await _keep_refreshing(
        _KEY_REFRESH_S, lambda: keys.refresh(store), "refresh the key cache", "keys", sleep
    )


async def _refresh_catalog(
    catalog: Catalog, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> None:
    # Several control planes share the store: a model added or removed on one reaches the others'
    # catalogs (the leader places it, every gateway routes to it) within a second.
    await _keep_refreshing(_CATALOG_REFRESH_S, catalog.reload, "reload the catalog", "models", sleep)


async def _keep_refreshing(
    interval_s: float,
    refresh: Callable[[], Awaitable[object]],
    what: str,
    kept: str,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Call refresh every interval_s for as long as the server runs, keeping what it has meanwhile.

    A store that is away (PostgreSQL restarting) is said once when it goes and once when it is
    back, not every interval: the gateway goes on serving what it holds in memory.
    """
    failing = False
    while True:
        await sleep(interval_s)
        try:
            await refresh()
        except StoreError as exc:
            if not failing:
                log.warning(f"could not {what}; the gateway keeps the {kept} it has", error=str(exc))
            failing = True
        except Exception:
            log.exception(f"could not {what} from the store; keeping the {kept} it has")
        else:
            if failing:
                log.info("the store answers again", then=what)
            failing = False


async def _refresh_quotas(
    store: Store, quotas: Quotas, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> None:
    # `sleep` is a seam, as for the keys: a test proves the interval without waiting on a clock.
    # While the store is away the gateway admits by the limits and budgets it has, counting itself.
    await _keep_refreshing(
        _QUOTA_REFRESH_S, lambda: quotas.refresh(store), "reload limits and budgets", "ones", sleep
    )


@contextlib.asynccontextmanager
async def _serve_app(
    app: web.Application, refuse: Refusal, address: str, key: str, drain_s: float
) -> AsyncIterator[tuple[str, int]]:
    """Serve app on address; the host and port it bound (the port the system picked, for port 0).

    refuse: what the listener says, in its API's shape, of a request aiohttp could not read.
    """
    host, port = split_host_port(address, key)
    runner = ListenerRunner(app, refuse, access_log=None, shutdown_timeout=drain_s, **SERVER_OPTIONS)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        try:
            await site.start()
        except OSError as exc:
            raise cannot_listen(address, key, exc) from None
        bound_host, bound_port = runner.addresses[0][:2]
        yield bound_host, bound_port
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def server_role(cfg: ServerConfig) -> AsyncIterator[ServerHandle]:
    """The server, built in steps on one exit stack, which stops them in the reverse order.

    Store, catalog, accounting, the fleet (leadership and the agents' listener), the gateway with
    its pages, the admin listener, metrics: each step registers its own teardown as it builds.
    """
    async with contextlib.AsyncExitStack() as stack:
        _prepare_the_process(stack)
        store = await stack.enter_async_context(open_store(cfg.store, server=True))
        keys = KeyCache(lookup=functools.partial(find_key, store))
        await keys.refresh(store)
        # server.yaml's models and those added with `llmgw ctl model add`, which the store kept. The
        # one catalog: the gateway routes by it, the admin API changes it, the reconciler places it.
        catalog = await Catalog.open(cfg, store)
        inventory = Inventory(grace_s=cfg.control.grace_s)
        # What the last run journaled but did not write to the store is replayed into it first, so that
        # budgets count everything spent before this start, and the last minute refills the windows.
        # Entered before the task group, so that its segments close after the journal's task has ended.
        journal, recent = await stack.enter_async_context(
            open_journal(cfg.usage_journal_dir, store, cfg.usage_sync_s)
        )
        tasks = await _Tasks.enter(stack)
        tasks.keep(_refresh_keys(store, keys), "key-cache-refresh")
        usage, quotas = await _start_accounting(stack, tasks, cfg, store, catalog, journal, recent)
        mirror = await stack.enter_async_context(MirrorClient(cfg.mirror)) if cfg.mirror.api else None
        # Only where this server places replicas (`control.enabled`): no one else sends nodes its URLs.
        local_files = (
            await stack.enter_async_context(serve_local_files(cfg, catalog)) if cfg.control.enabled else None
        )
        registry = new_registry()
        control_metrics = ControlMetrics(registry, inventory, usage)
        budgets = Snapshot(registry, lambda: budget_families(quotas))
        metrics = Metrics(registry, [s for s in (control_metrics.snapshot, budgets) if s is not None])
        fleet = await _join_the_fleet(stack, tasks, cfg, inventory, catalog, control_metrics)
        gateway_metrics = GatewayMetrics(registry, catalog, log_requests=cfg.log.requests)
        # Models served outside the fleet are routed by their endpoints, the others by the fleet's table:
        # the leader's published one while this server is a standby, else its own inventory's.
        endpoints = Endpoints(
            catalog, fleet.routes if fleet.routes is not None else inventory, cfg.control.endpoint_check_s
        )
        tasks.keep(endpoints.run(), "endpoint-checks")
        app = _gateway_app(cfg, catalog, fleet, keys, quotas, usage, gateway_metrics, endpoints)
        tasks.keep(app[COLD_STARTS_KEY].keep_reporting(store), "cold-start-reports")
        # The last hours for the pages' charts, sampled from the same counters a scraper reads.
        history = History(gateway_metrics, inventory, cfg.monitoring.window_s)
        tasks.keep(history.run(), "history-sampler")
        app[HISTORY_KEY] = history
        # Engines whose node's agent is away serve on while they answer the gateway's own checks.
        tasks.keep(EngineChecks(inventory, cfg.control.engine_check_s).run(), "engine-checks")
        reconciler = _reconciler(
            cfg, inventory, catalog, app, control_metrics, mirror, local_files, Scaling(store, registry)
        )
        # Only the leader places and reconciles (always this server, without PostgreSQL).
        lead = functools.partial(_lead, fleet.routes, reconciler)
        tasks.keep(while_leading(fleet.leadership, lead), "lead")
        app[UPGRADES_KEY] = _start_upgrades(tasks, fleet, inventory, store)
        pages = _mount_pages(app, cfg, store, quotas, inventory, catalog, mirror)
        gateway = await stack.enter_async_context(
            _serve_app(app, unreadable, cfg.listen, "listen", cfg.drain_timeout_s)
        )
        # Before the gateway drains: a request held for a cold start would otherwise wait out the drain.
        stack.callback(app[COLD_STARTS_KEY].fail_all, "this server is stopping; retry on another")
        url = f"http://{bound.address(*gateway)}"
        admin_app = _admin_app(cfg, inventory, catalog, pages, mirror, app, metrics, reconciler)
        admin = await _serve_admin(stack, cfg, admin_app)
        admin_url = f"http://{bound.address(*admin)}"
        await _record_the_ports(stack, cfg, gateway, admin, fleet.agent_port)
        metrics_url = await stack.enter_async_context(
            serve_metrics(metrics, cfg.metrics_listen, "metrics_listen")
        )
        _freeze_the_heap(stack, tasks, inventory)
        log.info(
            "server ready",
            gateway=url,
            admin=admin_url,
            metrics=metrics_url or f"{admin_url}/metrics",
            agent_port=fleet.agent_port,
            models=catalog.names(),
        )
        yield ServerHandle(
            gateway_url=url,
            agent_port=fleet.agent_port,
            store=store,
            keys=keys,
            inventory=inventory,
            quotas=quotas,
            usage=usage,
            admin_url=admin_url,
            metrics_url=metrics_url,
        )
        log.info("server stopping")


def _start_upgrades(tasks: _Tasks, fleet: _Fleet, inventory: Inventory, store: Store) -> Upgrades:
    """Rolls of the agents to another release (`llmgw ctl upgrade`), on either listener's admin API:
    carried out by the leader, kept in the store for the next one, refused by a standby."""
    standby = fleet.leadership.refusal if fleet.leadership is not None else _leading
    upgrades = Upgrades(inventory, store, standby)
    tasks.keep(while_leading(fleet.leadership, upgrades.run), "agent-upgrades")
    return upgrades


async def _serve_admin(
    stack: contextlib.AsyncExitStack, cfg: ServerConfig, admin_app: web.Application
) -> tuple[str, int]:
    """The admin listener, serving; a warning at every start when other machines can reach it."""
    admin = await stack.enter_async_context(
        _serve_app(
            admin_app, admin_listener.unreadable, cfg.admin_listen, "admin_listen", cfg.drain_timeout_s
        )
    )
    # Said at every start, not refused: an operator may mean it (a firewall, a private network).
    exposed = admin_listener.exposure(*admin)
    if exposed is not None:
        log.warning(exposed)
    return admin


def _prepare_the_process(stack: contextlib.AsyncExitStack) -> None:
    """Room for a file per connected node, and the loop's exception handler, restored at the end."""
    # One open file per connected node: a process starts allowed 1,024 (llmgw/openfiles.py).
    openfiles.report(openfiles.raise_limit())
    loop = asyncio.get_running_loop()
    stack.callback(loop.set_exception_handler, loop.get_exception_handler())
    openfiles.explain_accept_failures(loop)


@attrs.frozen
class _Tasks:
    """The server's task group, and those of its tasks that are cancelled when it stops.

    The others (the usage writer, the journal) are stopped by a callback of their own, so that
    they finish their work: written once more after the gateway has drained.
    """

    group: asyncio.TaskGroup
    cancelled: list[asyncio.Task[None]]

    @classmethod
    async def enter(cls, stack: contextlib.AsyncExitStack) -> _Tasks:
        tasks = cls(await stack.enter_async_context(asyncio.TaskGroup()), [])
        # Registered after the group, so it runs before the group waits for them.
        stack.callback(_cancel_all, tasks.cancelled)
        return tasks

    def keep(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run work until the server stops, when it is cancelled."""
        self.cancelled.append(self.group.create_task(work, name=name))

    def run(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run work until it ends of itself: told to by a callback on the stack."""
        self.group.create_task(work, name=name)


async def _start_accounting(
    stack: contextlib.AsyncExitStack,
    tasks: _Tasks,
    cfg: ServerConfig,
    store: Store,
    catalog: Catalog,
    journal: Journal,
    recent: list[Entry],
) -> tuple[UsageRecorder, Quotas]:
    """Usage recorded and written, and the limits and budgets it counts against, kept fresh."""
    usage = UsageRecorder(journal=journal)
    # Servers sharing one PostgreSQL each admit requests: each leases part of every limited scope's
    # allowance there, or each would admit a project's whole rpm and budget on its own.
    allowance = Allowance(store.pool) if isinstance(store, PostgresStore) else None
    quotas = Quotas(
        usage, default_rpm=cfg.auth.default_rpm, default_tpm=cfg.auth.default_tpm, allowance=allowance
    )
    await quotas.refresh(store)
    quotas.restore(recent)
    for warning in budget_warnings(cfg, quotas.budgets, catalog.models(), quotas.prices):
        log.warning(warning)
    # Not cancelled but stopped (registered after the group, so before it
    # waits): the writer flushes once more after the gateway has drained.
    tasks.run(usage.run(store), "usage-writer")
    tasks.run(journal.run(), "usage-journal")
    stack.callback(journal.stop)
    stack.callback(usage.stop)
    tasks.keep(_refresh_quotas(store, quotas), "quota-refresh")
    if allowance is not None:
        tasks.keep(allowance.run(), "allowance-renewal")
        # Runs once the gateway has drained (it is served later, so stopped earlier): what the
        # leases hold unused goes back at once, rather than when the rows lapse.
        stack.push_async_callback(allowance.give_back)
    return usage, quotas


@attrs.frozen
class Scaling:
    """Where the scale decisions are kept, and the registry their series go to."""

    store: Store
    registry: CollectorRegistry


@attrs.frozen
class _Fleet:
    """This server's place among the control planes, and the port agents connect to."""

    # None without PostgreSQL: this server alone leads.
    leadership: Leadership | None
    # The leader's published routing table, followed while this server is a standby.
    routes: FleetRoutes | None
    agent_port: int


async def _join_the_fleet(
    stack: contextlib.AsyncExitStack,
    tasks: _Tasks,
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    control_metrics: ControlMetrics,
) -> _Fleet:
    """The election (with PostgreSQL), then the agents' listener, gated by it."""
    leadership, agent_cfg = await _leadership(cfg)
    # With several control planes, the gateway routes by the leader's published table while this
    # one is a standby (control/ha/publish.py); alone, by its own inventory. Made before the
    # election starts: its LISTEN must be made on the very first connection.
    routes = None
    if leadership is not None:
        routes = FleetRoutes(inventory, leadership, catalog, cfg.control.grace_s)
        await stack.enter_async_context(leadership)
    agent_port = await stack.enter_async_context(
        serve_agents(agent_cfg, inventory, refused=control_metrics.agent_refused, gate=leadership)
    )
    if routes is not None:
        tasks.keep(routes.follow(), "routing-table-follow")
        tasks.keep(_refresh_catalog(catalog), "catalog-refresh")
        if not await routes.first_look(_FIRST_LOOK_S):
            log.warning(
                "the leader's routing table could not be read yet; the gateway serves without it until "
                "it is (requests for the fleet's models fail meanwhile)",
                within_s=_FIRST_LOOK_S,
            )
    return _Fleet(leadership, routes, agent_port)


def _gateway_app(
    cfg: ServerConfig,
    catalog: Catalog,
    fleet: _Fleet,
    keys: KeyCache,
    quotas: Quotas,
    usage: UsageRecorder,
    gateway_metrics: GatewayMetrics,
    endpoints: Endpoints,
) -> web.Application:
    """The client-facing app (/v1/*), with what its admin routes read of this server."""
    app = make_gateway_app(
        cfg,
        catalog,
        endpoints,
        keys,
        Admission(cfg, catalog, quotas, usage),
        gateway_metrics,
    )
    app[ENDPOINTS_KEY] = endpoints

    def plane() -> views.ControlPlane:
        return control_plane_view(cfg, fleet.leadership)

    app[CONTROL_PLANE_KEY] = plane
    # `ctl model add` of a model with no price says budgets never bind on it.
    app[BUDGETS_KEY] = lambda: quotas.budgets
    app[PRICES_KEY] = lambda: quotas.prices
    return app


def _reconciler(
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    app: web.Application,
    control_metrics: ControlMetrics,
    mirror: MirrorClient | None,
    local_files: LocalFiles | None,
    scaling: Scaling,
) -> Reconciler | None:
    """What places the catalog's models on the fleet, when this server does (`control.enabled`)."""
    if not cfg.control.enabled:
        return None
    # A draining node's replicas are stopped once the gateway has nothing in flight there.
    in_flight = app[ROUTER_KEY].in_flight
    cold_starts = app[COLD_STARTS_KEY]
    # A request held for a cold model is acted on now, not at the next interval.
    cold_starts.subscribe(inventory.changed.set)
    reconciler = Reconciler(
        cfg,
        inventory,
        catalog,
        in_flight=in_flight,
        metrics=control_metrics,
        mirror=mirror,
        local_files=local_files,
        scaler=Scaler(in_flight, cold_starts, store=scaling.store, registry=scaling.registry),
    )
    # `ctl explain` shows a node the model is backing off from as such, not as a candidate.
    app[BACKOFF_KEY] = reconciler.backoff
    app[SCALER_KEY] = reconciler.scaler
    app[NEEDS_KEY] = reconciler.needs
    return reconciler


def _mount_pages(
    app: web.Application,
    cfg: ServerConfig,
    store: Store,
    quotas: Quotas,
    inventory: Inventory,
    catalog: Catalog,
    mirror: MirrorClient | None,
) -> WebContext:
    """The pages (login, profile, /admin) and the admin API under /admin, on the client port."""
    # /v1/* never looks a session up.
    pages = WebContext(cfg=cfg, store=store, spent=quotas.spent)
    mount_client_port(app, cfg, inventory, catalog, pages, mirror)
    return pages


def _admin_app(
    cfg: ServerConfig,
    inventory: Inventory,
    catalog: Catalog,
    pages: WebContext,
    mirror: MirrorClient | None,
    gateway_app: web.Application,
    metrics: Metrics,
    reconciler: Reconciler | None,
) -> web.Application:
    """The admin listener's app: cluster pages, the admin API (`llmgw ctl`) and /metrics."""
    # With `llmgw ctl mirror` relayed to the mirror's admin listener.
    admin_app = make_admin_app(cfg, inventory, catalog, pages, mirror)
    admin_app[BUDGETS_KEY] = gateway_app[BUDGETS_KEY]
    admin_app[PRICES_KEY] = gateway_app[PRICES_KEY]
    admin_app[CONTROL_PLANE_KEY] = gateway_app[CONTROL_PLANE_KEY]
    admin_app[HISTORY_KEY] = gateway_app[HISTORY_KEY]
    admin_app[ENDPOINTS_KEY] = gateway_app[ENDPOINTS_KEY]
    admin_app[UPGRADES_KEY] = gateway_app[UPGRADES_KEY]
    admin_app.router.add_get("/metrics", metrics.handle)
    if reconciler is not None:
        admin_app[BACKOFF_KEY] = reconciler.backoff
        admin_app[SCALER_KEY] = reconciler.scaler
        admin_app[NEEDS_KEY] = reconciler.needs
    return admin_app


async def _record_the_ports(
    stack: contextlib.AsyncExitStack,
    cfg: ServerConfig,
    gateway: tuple[str, int],
    admin: tuple[str, int],
    agent_port: int,
) -> None:
    """For `llmgw ctl --config`: the ports as bound, which server.yaml does not know for port 0."""
    listening = bound.Listening(
        pid=os.getpid(),
        gateway=bound.address(*gateway),
        admin=bound.address(*admin),
        agent_port=agent_port,
    )
    recorded = await bound.record(Path(cfg.state_dir), listening)
    if recorded is not None:
        # Removed before the listeners close, so no ctl dials a port that is going away.
        stack.push_async_callback(bound.forget, recorded, listening.pid)


def _freeze_the_heap(stack: contextlib.AsyncExitStack, tasks: _Tasks, inventory: Inventory) -> None:
    # What start-up built lives as long as the server; what registering nodes build, as long as
    # they stay: neither should be walked by every full collection (llmgw/heap.py).
    heap.freeze()
    stack.callback(gc.unfreeze)
    tasks.keep(heap.freeze_after_registrations(lambda: inventory.registrations), "heap-freeze")


async def _leadership(cfg: ServerConfig) -> tuple[Leadership | None, ServerConfig]:
    """The election when the store is PostgreSQL, and the configuration the agent service listens by.

    A port is chosen now when agent_listen asks for any (port 0): the leader's address, which
    standbys give agents, must name it before the service listens.
    """
    if not is_postgres_url(cfg.database):
        return None, cfg
    host, port = split_host_port(cfg.agent_listen, "agent_listen")
    port = port or await asyncio.to_thread(free_port, host)
    agent_cfg = config.evolve(cfg, agent_listen=f"{bound.address(host, port)}")
    name = plane_name(cfg.control.name)
    leadership = Leadership(cfg.database, name, advertised(cfg.control.advertise, host, port))
    return leadership, agent_cfg


async def _lead(routes: FleetRoutes | None, reconciler: Reconciler | None) -> None:
    """What only the leader does: publish the routing table, and once settled, place and reconcile."""
    async with asyncio.TaskGroup() as tasks:
        if routes is not None:
            tasks.create_task(routes.publish(), name="routing-table-publish")
            # Nothing is placed before the nodes of the last table have reconnected (or grace_s).
            await routes.lead()
        if reconciler is not None:
            tasks.create_task(reconciler.run(), name="reconciler")


def _leading() -> str | None:
    """Why this server may not do the leader's work: never, alone on its store."""
    return None


def control_plane_view(cfg: ServerConfig, leadership: Leadership | None) -> views.ControlPlane:
    if leadership is None:
        name = plane_name(cfg.control.name)
        return views.ControlPlane(name=name, role="leader", leader=name, leader_address="")
    leader = leadership.leader
    return views.ControlPlane(
        name=leadership.name,
        role="leader" if leadership.leading else "standby",
        leader=leader.name if leader is not None else "",
        leader_address=leader.advertise if leader is not None else "",
    )


def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
