"""Prometheus metrics: one registry per role, served as text on /metrics.

Each role builds its own CollectorRegistry rather than using prometheus-client's
global one: several roles share one process (`--dev`), and tests start many
servers in one interpreter, whose series would otherwise collide or add up.
Rendering the page walks every series, so it runs in a thread: a fleet's worth
of labelled series must not hold the event loop while a scraper waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llmgw.listen import cannot_listen, split_host_port

# Latencies of LLM requests: a cached short answer in milliseconds, a long generation in minutes.
LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


def new_registry() -> CollectorRegistry:
    """A registry with the standard process, platform and garbage-collector series."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class Snapshot(Collector):
    """Series read from the role's state at scrape time, on the event loop, and rendered in a thread.

    The state (nodes, replicas, engines) belongs to the loop and changes under it: the page's thread
    must never walk it. `take` runs on the loop and swaps in a finished list; `collect` only reads it.
    """

    def __init__(self, registry: CollectorRegistry, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read
        self._families: list[Metric] = []
        registry.register(self)

    def take(self) -> None:
        self._families = list(self._read())

    def collect(self) -> Iterable[Metric]:
        return self._families

    def describe(self) -> Iterable[Metric]:
        # Nothing described up front: the registry would otherwise collect once to learn the names,
        # and the names depend on the state (an engine's own metrics).
        return []


class Metrics:
    """A role's registry, what is read before each scrape, and the snapshots then taken."""

    def __init__(
        self,
        registry: CollectorRegistry,
        snapshots: Sequence[Snapshot] = (),
        refreshers: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        """refreshers run first, on the loop (reading other pages, say); then every snapshot is taken."""
        self.registry = registry
        self._snapshots = list(snapshots)
        self._refreshers = list(refreshers)
        # One scrape at a time: a second one's snapshot must not replace the first's mid-render.
        self._lock = asyncio.Lock()

    async def page(self) -> bytes:
        """The registry in Prometheus's text format."""
        async with self._lock:
            for refresh in self._refreshers:
                await refresh()
            for snapshot in self._snapshots:
                snapshot.take()
            return await asyncio.to_thread(generate_latest, self.registry)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp handler of /metrics."""
        # The classic text format every Prometheus reads (Debian's 2.x too): every name llmgw exports
        # is a legacy one, so the page is the same bytes either way.
        return web.Response(body=await self.page(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})


def metrics_app(metrics: Metrics) -> web.Application:
    """The app `metrics_listen` serves: /metrics and nothing else, so a scraper can be let reach it."""
    app = web.Application()
    app.router.add_get("/metrics", metrics.handle)
    return app


@contextlib.asynccontextmanager
async def serve_metrics(metrics: Metrics, address: str, key: str) -> AsyncIterator[str]:
    """Serve metrics_app at address (config key `key`); yields its URL, "" when address is empty."""
    if not address:
        yield ""
        return
    host, port = split_host_port(address, key)
    runner = web.AppRunner(metrics_app(metrics), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise cannot_listen(address, key, exc) from None
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()
