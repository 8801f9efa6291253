"""Choosing the replica for a request: the ready endpoint of the model with the fewest requests in flight.

A model with no ready replica is served by the first of its `fallbacks` that
has one; the request then names the fallback, since an engine answers only
to its own model's name, and the reply's x-llmgw-model header says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from aiohttp import web

from llmgw.config import ModelConfig, ServerConfig
from llmgw.control.catalog import Catalog
from llmgw.control.routes import EngineRoute
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pipeline import Call, Handler


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

    def __init__(self, catalog: Iterable[str] | Catalog, replicas: ReplicaTable) -> None:
        # The live catalog; a list of names (tests, a gateway without a control plane) is a fixed one.
        if not isinstance(catalog, Catalog):
            catalog = Catalog(ServerConfig(models=[ModelConfig(name=name) for name in catalog]))
        self._catalog = catalog
        self._replicas = replicas
        self._in_flight: dict[str, int] = {}
        # Where the search for the least loaded starts, turning each request,
        # so that replicas tied at zero (concurrency 1) share the work.
        self._turn = 0

    @property
    def in_flight(self) -> Mapping[str, int]:
        return self._in_flight

    def choose(self, model: str) -> str:
        return self.route(model)[1]

    def route(self, model: str) -> tuple[str, str]:
        """(the model that serves, its endpoint): model's own replica, else its first ready fallback's."""
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
        endpoints = self._replicas.ready_endpoints(model)
        if not endpoints:
            for fallback in definition.fallbacks:
                endpoints = self._replicas.ready_endpoints(fallback)
                if endpoints and self._catalog.get(fallback) is not None:
                    served = fallback
                    break
            else:
                why = self._replicas.why_no_ready(model)
                if definition.fallbacks:
                    names = ", ".join(definition.fallbacks)
                    why += f"; nor has any of its fallbacks ({names})"
                raise ApiError(503, why, type="server_error", code="no_ready_replica")
        self._turn += 1
        start = self._turn % len(endpoints)
        best = endpoints[start]
        best_load = self._in_flight.get(best, 0)
        for i in range(1, len(endpoints)):
            candidate = endpoints[(start + i) % len(endpoints)]
            load = self._in_flight.get(candidate, 0)
            if load < best_load:
                best, best_load = candidate, load
        self._in_flight[best] = best_load + 1
        return served, best

    def release(self, endpoint: str) -> None:
        left = self._in_flight[endpoint] - 1
        # Dropped at zero so replicas that went away do not linger in the table.
        if left:
            self._in_flight[endpoint] = left
        else:
            del self._in_flight[endpoint]

    async def __call__(self, call: Call, rest: Handler) -> web.StreamResponse:
        call.served_model, call.endpoint = self.route(call.model)
        call.route = self._replicas.route(call.endpoint)
        if call.served_model != call.model:
            # The fallback's engine answers only to its own name.
            call.payload["model"] = call.served_model
            call.body = json.dumps(call.payload).encode()
        try:
            return await rest(call)
        finally:
            self.release(call.endpoint)
