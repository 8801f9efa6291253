"""Every route of every listener, found in the apps' route tables, sent what a careless handler breaks on.

JSON nested a thousand deep, a body past the route's bound, and numbers past
any bound (1e400, which Python reads as inf; 1e20; a hundred-digit whole
number), in the body and in the query string; on the listeners the server
serves, a URL and a header past 8,190 bytes. Whatever the route, the answer
is never a 5xx nor a logged traceback, and a refusal is in the shape of the
route's API: OpenAI's under /v1, the admin API's {"error": "..."}, a page on
the pages. A route that reads JSON refuses the deep body and the numbers no
JSON holds. The routes are read from each app's router, not listed here: a
route added to any table, or to the gateway, is sent them too, so the next
route cannot skip the shared reader (llmgw/bodies.py) unnoticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import re
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import aiohttp
import attrs
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request
from prometheus_client import CollectorRegistry

import llmgw
from llmgw import pki
from llmgw.adminapi.auth import hash_token
from llmgw.adminapi.routes import Route
from llmgw.bodies import MAX_ADMIN_BODY, MAX_FORM, MAX_LINE, SERVER_OPTIONS
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig, TLSConfig
from llmgw.control.inventory import Inventory
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.metrics import Metrics, metrics_app
from llmgw.mirror.admin import Fetches
from llmgw.mirror.admin import make_admin_app as make_mirror_admin_app
from llmgw.mirror.fetch import HubFetcher
from llmgw.proto.llmgw import v1 as pb
from llmgw.roles.mirror import make_mirror_app
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key
from llmgw.web import admin_listener
from llmgw.web.admin_listener import document, make_admin_app
from llmgw.web.client_port import ADMIN, mount_client_port
from llmgw.web.context import WebContext

from .gateway.conftest import FakeReplicas
from .threaded import error_records

Shape = Literal["openai", "admin", "page", "any"]
TOKEN = "every-route-admin-token"
CHAT, EMBED = "sim-chat", "sim-embed"

# What each path parameter is given: values that exist where the route looks them up, so that the
# route gets as far as reading its body. The first candidate that leads to the route is used; a
# parameter with no value here fails the test, naming it.
VALUES: dict[str, tuple[str, ...]] = {
    "name": (CHAT, "cluster.js"),
    "model": (CHAT,),
    "id": ("gpu-01",),
    "item": ("1",),
    "scope": ("org:1",),
    "user": ("1",),
    "user_id": ("1",),
    "key_id": ("1",),
    "action": ("approve", "create"),
    "shard_id": ("s1",),
    "path": ("",),
}
# Where a route needs another value: a node's logs are asked of its agent, which the test's node does
# not have (ten seconds, then a 504, each time).
VALUES_AT: dict[str, dict[str, tuple[str, ...]]] = {"/nodes/{id}/logs": {"id": ("no-such-node",)}}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")

DEEP = b"[" * 1000 + b"]" * 1000
# Past every bound: past what a float holds (Python reads it as inf), past any count or price, past
# what SQLite's INTEGER holds, and below zero.
NUMBERS = ("1e400", "-1e400", "1e20", "1" + "0" * 30, "1" + "0" * 101, "-1e20")
# Numbers no JSON reader here takes: every route that reads JSON refuses them, whatever the field.
UNREADABLE = ("1e400", "-1e400", "1" + "0" * 101)


def _numeric_fields(schema: dict[str, Any]) -> list[str]:
    """The properties of a JSON Schema object that may be numbers."""

    def numeric(prop: dict[str, Any]) -> bool:
        kinds = prop.get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else kinds
        return bool({"integer", "number"} & set(kinds)) or any(numeric(p) for p in prop.get("oneOf", []))

    return [name for name, prop in schema.get("properties", {}).items() if numeric(prop)]


_DOCUMENT = document(llmgw.__version__)
_SCHEMAS = _DOCUMENT["components"]["schemas"]
# The admin API's routes, by path under its prefix: what body each reads, and its numbers.
_API: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in admin_listener.API}
# Every numeric query parameter the admin tables declare, sent to every route as well.
_NUMERIC_QUERY = sorted(
    {
        p.name
        for r in (*admin_listener.API, *admin_listener.PAGES)
        for p in r.parameters
        if p.where == "query" and p.schema.get("type") in ("integer", "number")
    }
)
# OpenAI's numbers, which the gateway's routes take (their bodies have no declared schema here).
_OPENAI_NUMBERS = ("max_tokens", "max_completion_tokens", "n", "best_of", "temperature", "dimensions")


@attrs.frozen
class Listener:
    """One listener as the server serves it, and how to speak to each of its paths."""

    app: web.Application
    url: str
    # path -> the shape of its API's refusals.
    shape: Callable[[str], Shape]
    # path -> the headers that get a request past the route's credentials check.
    credentials: Callable[[str], dict[str, str]] = lambda path: {}
    # path -> the most bytes its body may hold.
    bound: Callable[[str], int] = lambda path: MAX_ADMIN_BODY
    ssl: ssl.SSLContext | None = None

    def api_route(self, method: str, canonical: str) -> Route | None:
        """The admin API's route of method and canonical ("/api/v1/orgs/{item}"), on either listener."""
        for prefix in ("", ADMIN):
            if canonical.startswith(prefix + "/api/"):
                return _API.get((method, canonical.removeprefix(prefix)))
        return None


async def _paths(app: web.Application) -> list[tuple[str, str, str]]:
    """(method, the route's path as declared, a path leading to it) for every route of app."""
    found = []
    for route in app.router.routes():
        resource = route.resource
        if route.method in ("HEAD", "*") or resource is None:
            continue
        canonical = resource.canonical
        if isinstance(resource, web.StaticResource):
            found.append((route.method, canonical, canonical + "/x"))
            continue
        names = _PLACEHOLDER.findall(canonical)
        missing = [n for n in names if n not in VALUES]
        assert not missing, f"{canonical}: give {', '.join(missing)} a value in VALUES"
        candidates = {**VALUES, **next((v for end, v in VALUES_AT.items() if canonical.endswith(end)), {})}
        for values in itertools.product(*(candidates[n] for n in names)):
            given = dict(zip(names, values, strict=True))
            path = _PLACEHOLDER.sub(lambda m, given=given: given[m[1]], canonical)  # type: ignore[misc]
            match = await app.router.resolve(make_mocked_request(route.method, path, app=app))
            if match.route is route:
                found.append((route.method, canonical, path))
                break
        else:
            pytest.fail(f"no value in VALUES leads to {route.method} {canonical}")
    return found


# --- the listeners -----------------------------------------------------------------------------


def _client_port_shape(path: str) -> Shape:
    if path.startswith(ADMIN + "/api/"):
        return "admin"
    if path.startswith("/v1/") or path == "/health":
        return "openai"
    return "page"


@contextlib.asynccontextmanager
async def _client_port(store: Store, engines: dict[str, str], state_dir: Path) -> AsyncIterator[Listener]:
    """The gateway with keys, limits and usage, its pages and /admin, as the server role mounts them."""
    cfg = ServerConfig(
        models=[ModelConfig(name=CHAT), ModelConfig(name=EMBED, kind="embeddings")],
        admin_tokens=[hash_token(TOKEN)],
        admin_listen="127.0.0.1:0",
        state_dir=str(state_dir),
    )
    catalog, inventory = Catalog(cfg, store), Inventory(5.0)
    inventory.attach(pb.Register(node_id="gpu-01"), "127.0.0.1:1")
    keys, recorder = KeyCache(), UsageRecorder()
    quotas = Quotas(recorder)
    replicas = FakeReplicas(endpoints={name: [url] for name, url in engines.items()})
    app = make_gateway_app(cfg, catalog, replicas, keys, Admission(cfg, catalog, quotas, recorder))
    mount_client_port(app, cfg, inventory, catalog, WebContext(cfg=cfg, store=store))
    key, _ = await create_key(store, "every-route")
    await keys.refresh(store)
    await quotas.refresh(store)

    def credentials(path: str) -> dict[str, str]:
        token = TOKEN if path.startswith(ADMIN + "/api/") else key
        return {"Authorization": f"Bearer {token}"}

    def bound(path: str) -> int:
        if path.startswith(ADMIN + "/api/"):
            return MAX_ADMIN_BODY
        return MAX_FORM if _client_port_shape(path) == "page" else app._client_max_size

    async with _served(app) as url:
        yield Listener(app, url, _client_port_shape, credentials, bound)


@contextlib.asynccontextmanager
async def _admin_listener(store: Store, state_dir: Path) -> AsyncIterator[Listener]:
    cfg = ServerConfig(models=[ModelConfig(name=CHAT)], admin_listen="127.0.0.1:0", state_dir=str(state_dir))
    inventory = Inventory(5.0)
    inventory.attach(pb.Register(node_id="gpu-01"), "127.0.0.1:1")
    app = make_admin_app(cfg, inventory, Catalog(cfg, store), WebContext(cfg=cfg, store=store))
    async with _served(app) as url:
        yield Listener(app, url, lambda path: "admin" if path.startswith("/api/") else "page")


@contextlib.asynccontextmanager
async def _served(
    app: web.Application, ssl_context: ssl.SSLContext | None = None, *, as_the_server: bool = True
) -> AsyncIterator[str]:
    """app on a loopback port; as_the_server: with the server role's options, as the client port and
    the admin listener are (the mirror's listeners and metrics are served with aiohttp's own)."""
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server(ssl=ssl_context, **(SERVER_OPTIONS if as_the_server else {}))
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@attrs.frozen
class _Pki:
    server: ssl.SSLContext
    client: ssl.SSLContext


def _pki(root: Path) -> _Pki:
    """A mirror's certificate and the control plane's, from one authority (blocking)."""
    ca = root / "ca"
    pki.init_ca(ca)
    cert, key = pki.issue_server(ca, "mirror", ["127.0.0.1"], root / "mirror")
    cp_cert, cp_key = pki.issue_agent(ca, "control-plane", root / "cp")
    ca_pem = str(ca / "ca.pem")
    return _Pki(
        server=pki.https_server_ssl_context(TLSConfig(ca=ca_pem, cert=str(cert), key=str(key)), "a test"),
        client=pki.https_client_ssl_context(
            TLSConfig(ca=ca_pem, cert=str(cp_cert), key=str(cp_key)), "a test"
        ),
    )


@contextlib.asynccontextmanager
async def _listeners(root: Path) -> AsyncIterator[dict[str, Listener]]:
    """Every listener llmgw serves over HTTP, each on a loopback port of its own."""
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(root / "llmgw.db"))
        engines = {}
        for name in (CHAT, EMBED):
            served = _served(make_sim_app(name), as_the_server=False)
            engines[name] = await stack.enter_async_context(served)
        mirror_root = root / "mirror"
        await asyncio.to_thread(mirror_root.mkdir)
        certs = await asyncio.to_thread(_pki, root / "pki")
        fetcher = await stack.enter_async_context(HubFetcher(mirror_root, "http://127.0.0.1:9", None))
        fetches = await stack.enter_async_context(Fetches(fetcher))
        mirror_admin = make_mirror_admin_app(mirror_root, fetches, "control-plane")
        listeners = {
            "client port": await stack.enter_async_context(_client_port(store, engines, root / "state")),
            "admin listener": await stack.enter_async_context(_admin_listener(store, root / "state")),
            "mirror": Listener(
                app := await asyncio.to_thread(make_mirror_app, mirror_root),
                await stack.enter_async_context(_served(app, as_the_server=False)),
                lambda path: "any",
            ),
            "mirror's admin listener": Listener(
                mirror_admin,
                await stack.enter_async_context(_served(mirror_admin, certs.server, as_the_server=False)),
                lambda path: "admin",
                ssl=certs.client,
            ),
            "metrics": Listener(
                app := metrics_app(Metrics(CollectorRegistry())),
                await stack.enter_async_context(_served(app, as_the_server=False)),
                lambda path: "any",
            ),
        }
        yield listeners


LISTENERS = (
    "client port",
    "admin listener",
    "mirror",
    "mirror's admin listener",
    "metrics",
)
# The mirror's listeners and metrics are served with aiohttp's own limits of a URL or header.
SERVER_LISTENERS = ("client port", "admin listener")


@pytest.fixture(params=LISTENERS)
async def listener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Listener]:
    async with _listeners(tmp_path) as listeners:
        yield listeners[request.param]


# --- asking and judging --------------------------------------------------------------------------


@attrs.frozen
class Answer:
    method: str
    path: str
    status: int
    content_type: str
    body: bytes

    def __str__(self) -> str:
        return f"{self.method} {self.path}: {self.status} {self.content_type} {self.body[:300]!r}"


async def _ask(
    listener: Listener,
    method: str,
    path: str,
    body: bytes,
    content_type: str,
    query: str = "",
    extra: dict[str, str] | None = None,
) -> Answer:
    headers = {**listener.credentials(path), "Content-Type": content_type, **(extra or {})}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        http.request(
            method,
            listener.url + path + query,
            data=io.BytesIO(body),
            headers=headers,
            allow_redirects=False,
            ssl=listener.ssl if listener.ssl is not None else True,
        ) as reply,
    ):
        return Answer(method, path, reply.status, reply.content_type, await reply.read())


def _in_shape(answer: Answer, shape: Shape) -> bool:
    """Whether a refusal is in its API's shape: OpenAI's error object, the admin API's sentence, a page."""
    if shape == "any":
        return True
    if shape == "page" and answer.content_type == "text/html":
        return True
    if answer.content_type != "application/json":
        return False
    error = json.loads(answer.body).get("error")
    admin = isinstance(error, str) and bool(error)
    openai = isinstance(error, dict) and isinstance(error.get("message"), str) and bool(error["message"])
    # What the body reader refuses before a page's handler (a form past its bound, a URL too long)
    # is answered in the listener's API's shape, as everything it refuses there.
    return {"admin": admin, "openai": openai, "page": admin or openai}[shape]


def _judge(listener: Listener, answers: list[Answer]) -> list[str]:
    """What is wrong with answers: a 5xx, or a refusal not in its route's shape."""
    wrong = []
    for answer in answers:
        if answer.status >= 500:
            wrong.append(f"a 5xx: {answer}")
        elif answer.status >= 400 and not _in_shape(answer, listener.shape(answer.path)):
            wrong.append(f"not in the shape of {listener.shape(answer.path)}: {answer}")
    return wrong


@contextlib.contextmanager
def _logged_errors() -> Iterator[list[str]]:
    """What the server logged as an error, or with a traceback, while the block ran; filled as it ends."""
    found: list[str] = []
    with error_records() as records, structlog.testing.capture_logs() as logged:
        yield found
    found += [f"logged: {r.getMessage()} {r.exc_info[1] if r.exc_info else ''!r}" for r in records.records]
    found += [f"logged: {e}" for e in logged if e.get("log_level") in ("error", "critical", "exception")]


def _reads_json(listener: Listener, method: str, canonical: str) -> bool:
    """Whether the route reads JSON: the gateway's POSTs, an admin API route with a view."""
    if listener.shape(canonical) == "openai" and method == "POST":
        return True
    route = listener.api_route(method, canonical)
    return route is not None and route.body is not None and route.body.view is not None


# --- the tests ---------------------------------------------------------------------------------


class TestEveryRouteOfEveryListener:
    async def test_json_nested_a_thousand_deep_is_never_a_5xx_and_a_json_route_refuses_it(
        self, listener: Listener
    ) -> None:
        """The bench route read it with request.json(): a RecursionError, a 500 and a traceback."""
        answers, taken = [], []
        with _logged_errors() as logged:
            for method, canonical, path in await _paths(listener.app):
                for body in (DEEP, b'{"model": "sim-chat", "x": ' + DEEP + b"}"):
                    answer = await _ask(listener, method, path, body, "application/json")
                    answers.append(answer)
                    if _reads_json(listener, method, canonical) and answer.status < 400:
                        taken.append(f"took JSON nested a thousand deep: {answer}")
        problems = taken + _judge(listener, answers) + logged
        assert not problems, "\n".join(problems)

    async def test_a_body_past_the_routes_bound_is_never_a_5xx_and_a_route_that_reads_it_refuses_it(
        self, listener: Listener
    ) -> None:
        answers, taken = [], []
        with _logged_errors() as logged:
            for method, canonical, path in await _paths(listener.app):
                if method == "GET":
                    continue
                page = listener.shape(path) == "page"
                over = listener.bound(path) + 1
                body = b"x=" + b"y" * (over - 2) if page else b'{"x": "' + b"y" * (over - 9) + b'"}'
                kind = "application/x-www-form-urlencoded" if page else "application/json"
                answer = await _ask(listener, method, path, body, kind)
                answers.append(answer)
                if (
                    (page and method == "POST") or _reads_json(listener, method, canonical)
                ) and not 400 <= answer.status < 500:
                    taken.append(f"took a body of {over:,} bytes, past its bound: {answer}")
        problems = taken + _judge(listener, answers) + logged
        assert not problems, "\n".join(problems)

    async def test_a_number_past_any_bound_is_never_a_5xx_and_a_route_taking_numbers_refuses_it(
        self, listener: Listener
    ) -> None:
        """{"rpm": 1e20} was a 500 (OverflowError); 1e400 was read as inf and written back as Infinity."""
        answers, taken = [], []
        with _logged_errors() as logged:
            for method, canonical, path in await _paths(listener.app):
                route = listener.api_route(method, canonical)
                view = route.body.view if route is not None and route.body is not None else None
                fields = _numeric_fields(_SCHEMAS[view.__name__]) if view is not None else []
                for number in NUMBERS:
                    query = "?" + "&".join(f"{name}={number}" for name in _NUMERIC_QUERY)
                    if view is not None:
                        sent = {name: "__N__" for name in fields}
                    else:
                        model = EMBED if "embed" in path else CHAT
                        sent = {
                            "model": model,
                            "messages": [{"role": "user", "content": "hi"}],
                            "prompt": "hi",
                        }
                        sent |= {"input": "hi", **{name: "__N__" for name in _OPENAI_NUMBERS}}
                    body = json.dumps(sent).replace('"__N__"', number).encode()
                    answer = await _ask(listener, method, path, body, "application/json", query)
                    answers.append(answer)
                    refuse = (fields and route is not None) or (
                        number in UNREADABLE and _reads_json(listener, method, canonical)
                    )
                    if refuse and not 400 <= answer.status < 500:
                        taken.append(f"took {number} in every number of {canonical}'s body: {answer}")
        problems = taken + _judge(listener, answers) + logged
        assert not problems, "\n".join(problems)


@pytest.fixture(params=SERVER_LISTENERS)
async def server_listener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Listener]:
    async with _listeners(tmp_path) as listeners:
        yield listeners[request.param]


class TestEveryRouteOfTheServer:
    """The listeners served with the server role's options (bodies.SERVER_OPTIONS)."""

    async def test_a_url_or_header_past_the_bound_is_refused_in_the_routes_shape(
        self, server_listener: Listener
    ) -> None:
        """aiohttp refused them before any handler, with a 400 in plain text."""
        listener = server_listener
        answers, taken = [], []
        long = "x" * MAX_LINE
        with _logged_errors() as logged:
            for method, _, path in await _paths(listener.app):
                for query, headers, status in ((f"?x={long}", {}, 414), ("", {"X-Long": long}, 431)):
                    answer = await _ask(listener, method, path, b"", "application/json", query, headers)
                    answers.append(answer)
                    if answer.status != status:
                        taken.append(f"not a {status}: {answer}")
        problems = taken + _judge(listener, answers) + logged
        assert not problems, "\n".join(problems)
