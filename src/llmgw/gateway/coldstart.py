"""Holding a request for an on-demand model while its first replica starts.

A model with `scale` and no ready replica is not refused at once: the request
waits while the control plane places and starts a replica, bounded by the
model's `timeouts.cold_start_s`, and is then served like any other. Every
request that arrives for the same cold model meanwhile waits on the same start
(one future per model), so a burst of a hundred starts one replica, not a
hundred. A request still waiting at the bound gets a 503 saying where the start
stands and when to retry (Retry-After); one whose start failed gets the
engine's own words.

The gateway only holds and records: which models were asked for and when
(`last_request`, what the control plane's scale decisions read, control/scaling.py),
and which are waiting (`waiting`). The control plane settles a start when its
replica is ready, or fails it with the reason; a waiter also looks at the routing
table itself every `recheck_s`, which is how a standby's gateway, whose table the
leader publishes, sees the replica the leader started.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping

import attrs
import structlog
from aiohttp import web

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig
from llmgw.errors import StoreError
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.gateway.router import ReplicaTable
from llmgw.ondemand import cold_start_bound_s, on_demand
from llmgw.store import Store
from llmgw.store.scale import note_requests

log = structlog.get_logger(__name__)

# How often a held request looks at the routing table itself, for a start no one here settles (the
# leader's, seen by a standby through the table it publishes).
RECHECK_S = 0.5
# How often this gateway writes its last request per on-demand model to the store, for the leader.
REPORT_S = 1.0
# What Retry-After says of a start whose length was never measured: soon, without hammering.
_UNMEASURED_RETRY_S = 30.0


@attrs.define
class _Start:
    """One model's start, shared by every request held for it."""

    # The wall clock when the first request asked for it.
    asked: float
    # None once a replica is ready; the reason, in words, when the start failed.
    done: asyncio.Future[str | None]
    held: int = 0


class ColdStarts:
    """The pipeline stage, before the router, that holds requests for a cold on-demand model."""

    def __init__(
        self,
        catalog: Catalog,
        replicas: ReplicaTable,
        clock: Callable[[], float] = time.time,
        recheck_s: float = RECHECK_S,
    ) -> None:
        """clock is the wall clock (its times are stored, and read by another server after a takeover)."""
        self._catalog = catalog
        self._replicas = replicas
        self._clock = clock
        self._recheck_s = recheck_s
        # Model -> the wall clock of its last request here.
        self.last_request: dict[str, float] = {}
        # Model -> the seconds its last measured cold start took, for the 503's Retry-After.
        self.expected: dict[str, float] = {}
        self._starts: dict[str, _Start] = {}
        self._listeners: list[Callable[[], None]] = []
        # Set when a start is asked for: the report to the store goes at once, not at the next second.
        self._asked = asyncio.Event()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call listener whenever a request asks for a cold model (the reconciler wakes at once)."""
        self._listeners.append(listener)

    def waiting(self) -> Mapping[str, float]:
        """Each model requests are held for -> the wall clock when its start was asked."""
        return {model: start.asked for model, start in self._starts.items()}

    def held(self, model: str) -> int:
        """How many requests are held for model now."""
        start = self._starts.get(model)
        return start.held if start is not None else 0

    def settle(self, model: str) -> None:
        """model has a ready replica: its held requests go on to the router."""
        self._finish(model, None)

    def fail(self, model: str, reason: str) -> None:
        """model's start failed: its held requests get a 503 with reason (the engine's own words)."""
        self._finish(model, reason)

    def fail_all(self, reason: str) -> None:
        """Every held request gets a 503 with reason: this server is stopping."""
        for model in list(self._starts):
            self._finish(model, reason)

    def _finish(self, model: str, outcome: str | None) -> None:
        start = self._starts.pop(model, None)
        if start is not None and not start.done.done():
            start.done.set_result(outcome)

    async def __call__(self, call: Call, rest: Handler) -> web.StreamResponse:
        model = call.model
        definition = self._catalog.get(model)
        if definition is None:
            return await rest(call)
        self.last_request[model] = self._clock()
        if on_demand(definition) and not self._served(definition):
            await self._hold(definition)
        return await rest(call)

    def _served(self, definition: ModelConfig) -> bool:
        """Whether the model, or one of its fallbacks, has a ready replica to route to now."""
        names = [definition.name, *definition.fallbacks]
        return any(self._replicas.ready_endpoints(name) for name in names)

    async def _hold(self, definition: ModelConfig) -> None:
        """Wait until the model has a ready replica; ApiError 503 when its start fails or takes too long."""
        model = definition.name
        start = self._starts.get(model)
        if start is None:
            start = _Start(asked=self._clock(), done=asyncio.get_running_loop().create_future())
            self._starts[model] = start
            log.info("holding requests while a replica starts", model=model)
            self._asked.set()
            for listener in self._listeners:
                listener()
        bound = cold_start_bound_s(definition)
        start.held += 1
        try:
            async with asyncio.timeout(bound):
                while not self._replicas.ready_endpoints(model):
                    await asyncio.wait([start.done], timeout=self._recheck_s)
                    if start.done.done():
                        if (reason := start.done.result()) is not None:
                            raise ApiError(
                                503,
                                f"{model} could not be started: {reason}",
                                type="server_error",
                                code="cold_start_failed",
                            )
                        break
        except TimeoutError:
            raise self._too_long(definition, start, bound) from None
        finally:
            start.held -= 1
        if self._starts.get(model) is start and self._replicas.ready_endpoints(model):
            # Seen here before the control plane said so: the next request finds it ready anyway.
            self._finish(model, None)

    def _too_long(self, definition: ModelConfig, start: _Start, bound: float) -> ApiError:
        """The 503 of a request held for the whole bound: where the start stands, and when to retry."""
        model = definition.name
        elapsed = self._clock() - start.asked
        expected = self.expected.get(model)
        retry = max(1.0, expected - elapsed) if expected is not None else _UNMEASURED_RETRY_S
        stands = self._replicas.why_no_ready(model).removeprefix(f"{model} has no ready replica: ")
        seconds = math.ceil(retry)
        return ApiError(
            503,
            f"{model} is starting ({stands}); this request waited {bound:g} s (timeouts.cold_start_s): "
            f"retry in about {seconds} s",
            type="server_error",
            code="cold_start_timeout",
            headers={"Retry-After": str(seconds)},
        )

    async def keep_reporting(self, store: Store, interval_s: float = REPORT_S) -> None:
        """Write this gateway's last request per on-demand model, and its held starts, to the store.

        The leader decides from them (control/scaling.py): a standby's gateway holding a request
        is how the leader hears a replica is wanted, and its requests keep the model from idling.
        Written in the background, every interval_s and at once when a start is asked for; never
        on the request's path.
        """
        written: dict[str, float] = {}
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._asked.wait()
            self._asked.clear()
            last = {
                model: at
                for model, at in self.last_request.items()
                if written.get(model) != at and (m := self._catalog.get(model)) is not None and on_demand(m)
            }
            try:
                await note_requests(store, last, self.waiting())
            except StoreError as exc:
                if not failing:
                    log.warning(
                        "could not write the requests for on-demand models to the store", error=str(exc)
                    )
                failing = True
                continue
            failing = False
            written.update(last)
