"""Models served outside the fleet: their endpoints' routing table, their checks, their state in words.

A model with `endpoints` is not placed on the fleet: an OpenAI-compatible server
already runs it (a vLLM on a machine without an agent, a cloud API). The
gateway routes to its endpoints as to a fleet model's replicas, by the same
policies, with the same keys, limits, budgets and usage: Endpoints is the
routing table the gateway reads, the fleet's own behind it for every other
model. A request there carries the endpoint's key in place of a replica's
secret, and names the model as the endpoint knows it.

Each endpoint is asked `GET <url>/models` with its key every
`control.endpoint_check_s` (and at once when the catalog changes): only one that
answered is routed to. One whose key is refused, that lists no such model or
that does not answer is out of the table, its state a sentence for `ctl
replicas` and the pages, until a check passes; so is one a request found
refusing its connection or its key, so that one fault costs one request, not
every request until the next check.

The key is read from the server's environment or a file at each check, held in
memory only, and sent only as the Authorization of requests to its own
endpoint: no state, sentence or log line here holds it.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
import attrs
import structlog
from aiohttp import hdrs, web

from llmgw.catalog import Catalog
from llmgw.config import EndpointConfig, ModelConfig
from llmgw.engines.base import OPENAI_APIS
from llmgw.gateway.router import ReplicaTable
from llmgw.routes import EngineRoute

log = structlog.get_logger(__name__)

EndpointStateName = Literal["checking", "ready", "failing"]
# What `ctl replicas` and the pages show in an endpoint's engine column.
ENDPOINT_ENGINE = "endpoint"
# How much of a /models listing is read: a cloud API lists hundreds of models, never megabytes.
_LISTING = 4 * 1024 * 1024
# How many of the models an endpoint lists a sentence names, when the one asked for is not among them.
_NAMED = 8


@attrs.frozen
class Endpoint:
    """One endpoint of a model, as the catalog declares it; its id is "<model>/<index>"."""

    id: str
    model: str
    url: str
    upstream_model: str
    key_env: str
    key_file: str

    @classmethod
    def of(cls, model: ModelConfig, index: int, config: EndpointConfig) -> Endpoint:
        return cls(
            id=f"{model.name}/{index}",
            model=model.name,
            url=config.url.rstrip("/"),
            upstream_model=config.model or model.name,
            key_env=config.api_key_env,
            key_file=config.api_key_file,
        )

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def key_named(self) -> str:
        """Where its key comes from, in words (never the key)."""
        if self.key_env:
            return f"api_key_env {self.key_env}"
        if self.key_file:
            return f"api_key_file {self.key_file}"
        return "no key is configured"


@attrs.frozen
class EndpointStatus:
    """An endpoint and its state, for the admin API, `ctl replicas` and the pages."""

    id: str
    model: str
    url: str
    upstream_model: str
    state: EndpointStateName
    # Why it is failing, or what was last said of it; "" when it is ready.
    detail: str
    # Unix time its state last changed.
    since: float


@attrs.define
class _State:
    state: EndpointStateName = "checking"
    detail: str = ""
    since: float = 0.0
    key: str = attrs.field(default="", repr=False)


class Endpoints:
    """The gateway's routing table: endpoints for models that have them, the fleet's for the others."""

    def __init__(
        self, catalog: Catalog, fleet: ReplicaTable, check_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._catalog = catalog
        self._fleet = fleet
        self._check_s = check_s
        self._clock = clock
        self._generation = -1
        self._by_model: dict[str, tuple[Endpoint, ...]] = {}
        self._by_id: dict[str, Endpoint] = {}
        self._states: dict[Endpoint, _State] = {}
        self._ready: dict[str, tuple[str, ...]] = {}
        self._lost: dict[str, asyncio.Future[str]] = {}
        # Set by a catalog change: the checks run at once for a model just added.
        self._changed = asyncio.Event()
        catalog.subscribe(self._changed.set)

    def _sync(self) -> None:
        """Follow the catalog: a model added, changed or removed is routed by its new definition."""
        if self._generation == self._catalog.generation:
            return
        self._generation = self._catalog.generation
        by_model = {
            m.name: tuple(Endpoint.of(m, i, e) for i, e in enumerate(m.endpoints))
            for m in self._catalog.models()
            if m.endpoints
        }
        now = self._clock()
        # An endpoint whose definition is unchanged keeps its state; a changed one is checked afresh.
        self._states = {e: self._states.get(e) or _State(since=now) for eps in by_model.values() for e in eps}
        self._by_model = by_model
        self._by_id = {e.id: e for eps in by_model.values() for e in eps}
        self._lost = {k: v for k, v in self._lost.items() if k in self._by_id}
        self._index()

    def _index(self) -> None:
        self._ready = {
            model: tuple(e.id for e in eps if self._states[e].state == "ready")
            for model, eps in self._by_model.items()
        }

    def serves(self, model: str) -> bool:
        """Whether model is served by endpoints (not by the fleet)."""
        self._sync()
        return model in self._by_model

    def ready_endpoints(self, model: str) -> Sequence[str]:
        self._sync()
        ready = self._ready.get(model)
        return ready if ready is not None else self._fleet.ready_endpoints(model)

    def why_no_ready(self, model: str) -> str:
        self._sync()
        endpoints = self._by_model.get(model)
        if endpoints is None:
            return self._fleet.why_no_ready(model)
        said = [f"{e.id}: {self._words(e, self._states[e])}" for e in endpoints]
        return f"{model} has no ready endpoint: {'; '.join(said)}"

    @staticmethod
    def _words(endpoint: Endpoint, state: _State) -> str:
        if state.state == "checking":
            return f"{endpoint.url} is not checked yet"
        return state.detail or state.state

    def route(self, endpoint: str) -> EngineRoute | None:
        self._sync()
        found = self._by_id.get(endpoint)
        if found is None:
            return self._fleet.route(endpoint)
        lost = self._lost.get(endpoint)
        if lost is None:
            # Never resolved: an endpoint has no agent whose loss abandons its requests; its timeouts do.
            lost = self._lost[endpoint] = asyncio.get_running_loop().create_future()
        return EngineRoute(
            node_id=found.host,
            shard_id=found.id,
            secret=self._states[found].key,
            lost=lost,
            refused=lambda reason: self.failed(endpoint, reason),
            url=found.url,
            upstream_model=found.upstream_model,
            # Any OpenAI-compatible server: Messages and Responses are said to it as chat completions.
            native_apis=OPENAI_APIS,
        )

    def failed(self, endpoint_id: str, reason: str) -> None:
        """A request found the endpoint refusing it: out of the table until a check passes."""
        found = self._by_id.get(endpoint_id)
        if found is not None:
            self._set(found, "failing", reason)

    def statuses(self, model: str | None = None) -> list[EndpointStatus]:
        """Every endpoint (or model's) with its state."""
        self._sync()
        return [
            EndpointStatus(e.id, e.model, e.url, e.upstream_model, s.state, s.detail, s.since)
            for e, s in self._states.items()
            if model is None or e.model == model
        ]

    def _set(self, endpoint: Endpoint, state: EndpointStateName, detail: str) -> None:
        current = self._states.get(endpoint)
        if current is None:
            return  # it left the catalog while it was checked
        if (current.state, current.detail) != (state, detail):
            if state != current.state:
                log.info(
                    "an endpoint is ready" if state == "ready" else "an endpoint is failing",
                    endpoint=endpoint.id,
                    url=endpoint.url,
                    detail=detail,
                )
                current.since = self._clock()
            current.state, current.detail = state, detail
            self._index()

    async def check(self, session: aiohttp.ClientSession) -> None:
        """Check every endpoint once, together."""
        self._sync()
        async with asyncio.TaskGroup() as group:
            for endpoint in list(self._states):
                group.create_task(self._check_one(session, endpoint))

    async def run(self) -> None:
        """Check every endpoint every check_s, and at once after a catalog change, until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self._check_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                self._changed.clear()
                await self.check(session)
                try:
                    async with asyncio.timeout(self._check_s):
                        await self._changed.wait()
                except TimeoutError:
                    pass

    async def _check_one(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        key, problem = await _read_key(endpoint)
        state = self._states.get(endpoint)
        if state is None:
            return
        state.key = key
        if problem:
            self._set(endpoint, "failing", problem)
            return
        headers = {hdrs.AUTHORIZATION: f"Bearer {key}"} if key else {}
        try:
            async with session.get(f"{endpoint.url}/models", headers=headers) as reply:
                status = reply.status
                body = await reply.content.read(_LISTING)
        except aiohttp.ClientConnectorError as exc:
            said = f"{endpoint.url} did not take the connection: {exc.os_error.strerror or exc.os_error}"
            self._set(endpoint, "failing", said)
            return
        except TimeoutError:
            said = f"{endpoint.url} did not answer GET /models within {self._check_s:g} s"
            self._set(endpoint, "failing", said)
            return
        except aiohttp.ClientError as exc:
            said = f"{endpoint.url} failed GET /models: {str(exc) or type(exc).__name__}"
            self._set(endpoint, "failing", said)
            return
        ready, detail = _judge(endpoint, status, body)
        self._set(endpoint, "ready" if ready else "failing", detail)


def _judge(endpoint: Endpoint, status: int, body: bytes) -> tuple[bool, str]:
    """(whether the endpoint may be routed to, what to say of it) from its answer to GET /models."""
    if status in (401, 403):
        return False, f"{endpoint.url} answered {status}: its key is wrong ({endpoint.key_named})"
    if status == 404:
        # Not every server lists its models; one that answers at all is tried, and a request's 404 says more.
        return True, f"{endpoint.url} has no /models to list its models"
    if status >= 400:
        return False, f"{endpoint.url} answered {status} to GET /models"
    try:
        listed = [m["id"] for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError):
        return True, ""
    if listed and endpoint.upstream_model not in listed:
        more = f" and {len(listed) - _NAMED} more" if len(listed) > _NAMED else ""
        named = ", ".join(str(m) for m in listed[:_NAMED])
        return (
            False,
            f"{endpoint.url} does not serve a model '{endpoint.upstream_model}' (it lists {named}{more})",
        )
    return True, ""


async def _read_key(endpoint: Endpoint) -> tuple[str, str]:
    """(the key, "") or ("", why it cannot be had); "" and "" for an endpoint without one."""
    if endpoint.key_env:
        key = os.environ.get(endpoint.key_env, "").strip()
        if not key:
            return (
                "",
                f"its key's environment variable {endpoint.key_env} is not set in the server's environment",
            )
        return key, ""
    if endpoint.key_file:
        path = Path(endpoint.key_file)
        try:
            # In a thread: a file on a network mount may take its time.
            key = (await asyncio.to_thread(path.read_text, encoding="utf-8")).strip()
        except OSError as exc:
            return "", f"its key file {endpoint.key_file} cannot be read: {exc.strerror or exc}"
        if not key:
            return "", f"its key file {endpoint.key_file} is empty"
        return key, ""
    return "", ""


# The server's table on its gateway app: the admin API and the pages show each endpoint's state from it.
ENDPOINTS_KEY = web.AppKey("llmgw.gateway.endpoints", Endpoints)
