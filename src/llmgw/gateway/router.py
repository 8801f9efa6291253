"""Choosing the replica for a request among the model's ready endpoints, by `router.policy`.

`least_in_flight` takes the one with the fewest requests in flight. `affinity` sends a request
with a session key (a header of `router.session_headers`, else the body's `user`) to its session's
replica; `prefix` does that too, and sends one without to the replica that most recently served
the longest start of its prompt (affinity.py). Both give way to the fewest in flight past the load
bound, and both choose only among ready endpoints: a draining or failed replica is never chosen.

A model with no ready replica is served by the first of its `fallbacks` that
has one (and, with `fallback_when_busy`, one whose every replica is that busy by
the first that has a replica below it); the request then names the fallback,
since an engine answers only to its own model's name, and the reply's
x-llmgw-model header says so. A model served by endpoints outside the fleet
(endpoints.py) is named as its endpoint knows it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

import structlog
from aiohttp import web

from llmgw import strictjson
from llmgw.catalog import Catalog
from llmgw.config import RouterConfig
from llmgw.gateway.affinity import PrefixIndex, Sessions, prompt_blocks
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler
from llmgw.gateway.proxy import EngineFailed, EngineRefused
from llmgw.routes import EngineRoute

log = structlog.get_logger(__name__)

# How many replicas one request tries when engines refuse it: enough to step past a lost
# node or two, not a walk through a whole fleet while the client waits.
_MAX_TRIES = 3
# How many times an engine may fail a request it took (a 5xx, a reset, nothing within
# timeouts.first_byte_s) before that failure is the answer: one more replica, not a second
# wait of first_byte_s behind every stalled one.
_MAX_FAILURES = 1


class ReplicaTable(Protocol):
    """What the gateway needs from the inventory."""

    def ready_endpoints(self, model: str) -> Sequence[str]:
        """Base URLs ("http://127.0.0.1:PORT") of the model's ready replicas."""
        ...

    def why_no_ready(self, model: str) -> str:
        """A sentence saying why the model has no ready replica."""
        ...

    def route(self, endpoint: str) -> EngineRoute | None:
        """The node, secret and lost signal of a ready endpoint; None when the table knows none."""
        ...


class Router:
    """The pipeline stage that picks call.endpoint and counts the request in flight until it ends."""

    def __init__(
        self,
        catalog: Catalog,
        replicas: ReplicaTable,
        config: RouterConfig | None = None,
        in_flight_by_model: dict[str, int] | None = None,
    ) -> None:
        """in_flight_by_model, when given, is kept counting requests in flight by the model serving them
        (the gateway's metrics read it)."""
        # The live one: a model added with ctl is routed to, one removed is a 404, without a restart.
        self._catalog = catalog
        self._replicas = replicas
        config = config if config is not None else RouterConfig()
        self._policy = config.policy
        self._factor = config.session_load_factor
        self._session_headers = tuple(config.session_headers)
        self._session_from_user = config.session_from_user
        self._sessions = Sessions()
        self.prefixes = PrefixIndex(config.prefix_index_entries)
        self._in_flight: dict[str, int] = {}
        self._by_model = in_flight_by_model if in_flight_by_model is not None else {}
        # Where the search for the least loaded starts, turning each request,
        # so that replicas tied at zero (concurrency 1) share the work.
        self._turn = 0

    @property
    def in_flight(self) -> Mapping[str, int]:
        return self._in_flight

    def route(
        self, model: str, session: str = "", blocks: Sequence[int] = (), tried: Collection[str] = ()
    ) -> tuple[str, str]:
        """(the model that serves, its endpoint): model's own replica, else its first ready fallback's.

        session is the request's session key, blocks its prompt's prefix hashes (affinity.py);
        both empty when it has none. tried: endpoints that already failed this request.
        """
        definition = self._catalog.get(model)
        if definition is None:
            known = ", ".join(sorted(self._catalog.names())) or "none"
            raise ApiError(
                404,
                f"the model '{model}' does not exist on this gateway (models: {known})",
                code="model_not_found",
                param="model",
            )
        served = model
        endpoints = self._ready(model, tried)
        if not endpoints:
            served, endpoints = self._fallback(definition.fallbacks, tried)
            if not endpoints:
                why = self._replicas.why_no_ready(model)
                if definition.fallbacks:
                    names = ", ".join(definition.fallbacks)
                    why += f"; nor has any of its fallbacks ({names})"
                raise ApiError(503, why, type="server_error", code="no_ready_replica")
        elif definition.fallback_when_busy and definition.fallbacks:
            bound = definition.fallback_when_busy
            if all(self._in_flight.get(e, 0) >= bound for e in endpoints):
                # Every replica is past its bound: a fallback with room takes it, else the least loaded.
                other, room = self._fallback(definition.fallbacks, tried, bound)
                if room:
                    served, endpoints = other, room
        best = ""
        if self._policy != "least_in_flight":
            if session:
                best = self._sessions.choose(served, session, endpoints, self._in_flight, self._factor)
            elif blocks and self._policy == "prefix":
                best = self.prefixes.choose(blocks, endpoints, self._in_flight, self._factor) or ""
        if not best:
            best = self._least(endpoints)
        if blocks and self._policy == "prefix":
            self.prefixes.record(blocks, best)
        self._in_flight[best] = self._in_flight.get(best, 0) + 1
        return served, best

    def _fallback(
        self, fallbacks: Sequence[str], tried: Collection[str], bound: int = 0
    ) -> tuple[str, Sequence[str]]:
        """The first fallback with ready endpoints (each with fewer than bound in flight, when bound)."""
        for fallback in fallbacks:
            endpoints = self._ready(fallback, tried)
            if bound:
                endpoints = [e for e in endpoints if self._in_flight.get(e, 0) < bound]
            if endpoints and self._catalog.get(fallback) is not None:
                return fallback, endpoints
        return "", ()

    def _ready(self, model: str, tried: Collection[str]) -> Sequence[str]:
        endpoints = self._replicas.ready_endpoints(model)
        if tried:
            return [e for e in endpoints if e not in tried]
        return endpoints

    def _least(self, endpoints: Sequence[str]) -> str:
        """The endpoint with the fewest requests in flight, ties taking turns."""
        self._turn += 1
        start = self._turn % len(endpoints)
        best = endpoints[start]
        best_load = self._in_flight.get(best, 0)
        for i in range(1, len(endpoints)):
            candidate = endpoints[(start + i) % len(endpoints)]
            load = self._in_flight.get(candidate, 0)
            if load < best_load:
                best, best_load = candidate, load
        return best

    def session_of(self, call: Call) -> str:
        """The request's session key: the first of the session headers it carries, else `user`; or empty."""
        if self._policy == "least_in_flight":
            return ""
        headers = call.request.headers
        for name in self._session_headers:
            value = headers.get(name)
            if value:
                return value
        if self._session_from_user:
            user = call.payload.get("user")
            if isinstance(user, str):
                return user
        return ""

    def release(self, endpoint: str) -> None:
        left = self._in_flight[endpoint] - 1
        # Dropped at zero so replicas that went away do not linger in the table.
        if left:
            self._in_flight[endpoint] = left
        else:
            del self._in_flight[endpoint]

    async def __call__(self, call: Call, rest: Handler) -> web.StreamResponse:
        body, tried, failures = call.body, set[str](), 0
        earlier: list[str] = []
        by_model = self._by_model
        session = self.session_of(call)
        # Only the prefix policy reads the prompt, and only for a request no session places.
        blocks = prompt_blocks(call.model, call.payload) if self._policy == "prefix" and not session else []
        while True:
            call.served_model, call.endpoint = self.route(call.model, session, blocks, tried)
            served = call.served_model
            by_model[served] = by_model.get(served, 0) + 1
            call.route = self._replicas.route(call.endpoint)
            definition = self._catalog.get(served)
            if definition is not None:
                call.timeouts = definition.timeouts
            call.body = body
            route = call.route
            # An endpoint knows the model by its own name; a fallback's engine answers only to the fallback's.
            named = route.upstream_model if route is not None and route.upstream_model else served
            if named != call.model:
                call.body = strictjson.dumps({**call.payload, "model": named}, ensure_ascii=False).encode()
            try:
                return await rest(call)
            except EngineFailed as failure:
                # Nothing of the reply reached the client (proxy.py): another ready replica takes the
                # request, so a lost node or a stalled engine costs its clients a wait, not an error.
                # Each endpoint is tried once; with none left, the last failure is the answer. It is
                # still one request: admission reserved once and settles once, around all the tries.
                tried.add(call.endpoint)
                failures += not isinstance(failure, EngineRefused)
                if (
                    call.route is None
                    or len(tried) >= _MAX_TRIES
                    or failures > _MAX_FAILURES
                    or not self._untried(call.model, tried)
                ):
                    # The client hears of every replica it was sent to, not only the last: a request
                    # moved off a node whose link was cut, and then failed elsewhere, names both.
                    if earlier:
                        failure.message += "; tried before: " + "; ".join(earlier)
                    raise
                earlier.append(f"{call.route.node_id}: {failure.message}")
                log.info(
                    "sending a request to another replica",
                    model=call.model,
                    failed=call.endpoint,
                    node=call.route.node_id,
                    why=failure.message,
                    request_id=call.request_id,
                )
            finally:
                self.release(call.endpoint)
                by_model[served] -= 1

    def _untried(self, model: str, tried: set[str]) -> bool:
        """Whether model (or a fallback it would be served by) has a ready endpoint not yet tried."""
        definition = self._catalog.get(model)
        names = [model, *(definition.fallbacks if definition is not None else ())]
        ready = [e for name in names for e in self._replicas.ready_endpoints(name)]
        return bool(ready) and not set(ready) <= tried
