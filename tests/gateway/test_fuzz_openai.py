"""The gateway's /v1 routes fuzzed: every refusal a 4xx in OpenAI's shape, never a 5xx or a traceback.

Hypothesis sends what a careless or hostile client might: any method, near-miss
paths, keys right and wrong, bodies that are bytes, JSON of every shape, chat
requests with fields of the wrong type, bodies that say they are gzip (and are,
or are not), charsets that do not exist. The catalog has a model and no replica,
so a request that is right in every way is the 503 "no ready replica".
"""

from __future__ import annotations

import contextlib
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import requests
import structlog
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.web.client_port import mount_client_port
from llmgw.web.context import WebContext

from ..threaded import ErrorRecords, error_records, serve_in_thread

# Enough to meet each kind of input below many times over in well under a minute on two busy cores.
EXAMPLES = 300
MODEL = "sim-chat"
_KEYS: list[str] = []


@contextlib.asynccontextmanager
async def _gateway(store: Store) -> AsyncIterator[web.Application]:
    """The client port as the server builds it: /v1, the pages and /admin, one model and no replica."""
    cfg = ServerConfig(models=[ModelConfig(name=MODEL)], auth=AuthConfig(enabled=True))
    plaintext, _ = await create_key(store, "fuzz")
    _KEYS[:] = [plaintext]
    keys = KeyCache()
    await keys.refresh(store)
    catalog, inventory = Catalog(cfg), Inventory(5.0)
    app = make_gateway_app(cfg, catalog, inventory, keys)
    mount_client_port(app, cfg, inventory, catalog, WebContext(cfg=cfg, store=store))
    yield app


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_in_thread(_gateway, tmp_path_factory.mktemp("fuzz-gateway")) as url:
        yield url


@pytest.fixture(scope="module")
def tracebacks() -> Iterator[ErrorRecords]:
    with error_records() as records:
        yield records


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_ODD = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | _JSON
_CHAT = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, "", "no-such-model", "sim-chat/"]) | _ODD},
    optional={
        "messages": st.just([{"role": "user", "content": "hi"}]) | _ODD,
        "prompt": st.just("hi") | _ODD,
        "max_tokens": st.integers(-(2**70), 2**70) | _ODD,
        "stream": st.booleans() | _ODD,
        "stream_options": st.just({"include_usage": True}) | _ODD,
        "n": st.integers(-3, 1000) | _ODD,
        "temperature": _ODD,
    },
)


def _encode(payload: Any) -> bytes:
    return json.dumps(payload).encode() if not isinstance(payload, bytes) else payload


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, Any]:
    body = _encode(draw(st.binary(max_size=120) | _JSON | _CHAT))
    headers = {}
    auth = draw(st.sampled_from(["key", "none", "Bearer sk-wrong", "Basic eDp5", "Bearer ", "key+"]))
    if auth in ("key", "key+"):
        headers["Authorization"] = f"Bearer {_KEYS[0]}" + ("x" if auth == "key+" else "")
    elif auth != "none":
        headers["Authorization"] = auth
    content_type = draw(
        st.sampled_from(
            [
                "application/json",
                "application/json; charset=utf-8",
                "application/json; charset=latin-1",
                "application/json; charset=no-such-charset",
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "",
            ]
        )
    )
    if content_type:
        headers["Content-Type"] = content_type
    encoding = draw(st.sampled_from(["", "", "gzip", "deflate", "identity", "x-unknown"]))
    if encoding:
        headers["Content-Encoding"] = encoding
        # Most of the time the body is what it says; sometimes it only says so.
        if draw(st.booleans()):
            body = (
                gzip.compress(body)
                if encoding == "gzip"
                else zlib.compress(body)
                if encoding == "deflate"
                else body
            )
    return {
        "method": draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])),
        "path": draw(
            st.sampled_from(
                [
                    "/v1/chat/completions",
                    "/v1/completions",
                    "/v1/models",
                    "/v1/models/",
                    "/v1/chat/completions/",
                    "/v1//chat/completions",
                    "/v1/embeddings",
                    "/admin/api/v1/models",
                ]
            )
        ),
        "headers": headers,
        "data": body,
    }


def _is_openai_error(reply: requests.Response) -> bool:
    if reply.headers.get("Content-Type", "").split(";")[0] != "application/json":
        return False
    error = reply.json().get("error")
    if reply.url.split("/", 3)[3].startswith("admin/api/"):
        # The admin API on the client port answers in its own shape.
        return isinstance(error, str) and bool(error)
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"])
        and isinstance(error.get("type"), str)
        and {"code", "param"} <= error.keys()
    )


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,
)
@given(request=_requests())
def test_whatever_a_client_sends_the_answer_is_never_a_5xx_and_every_refusal_is_in_openais_shape(
    request: dict[str, Any], gateway_url: str, tracebacks: ErrorRecords, http: requests.Session
) -> None:
    before = len(tracebacks.records)
    with structlog.testing.capture_logs() as logged:
        reply = http.request(
            request["method"],
            gateway_url + request["path"],
            headers=request["headers"],
            data=request["data"],
            allow_redirects=False,
            timeout=30,
        )
    said = f"{request['method']} {request['path']} {request['headers']} {request['data'][:80]!r}"
    if reply.status_code >= 500:
        # The one 5xx a right request gets here: the model has no replica to serve it.
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "no_ready_replica", (
            f"{said} -> {reply.status_code} {reply.text[:300]}"
        )
    if reply.status_code >= 400:
        assert _is_openai_error(reply), f"{said} -> {reply.status_code} {reply.text[:300]}"
    errors = [entry for entry in logged if entry.get("log_level") in ("error", "critical", "exception")]
    assert errors == [r.getMessage() for r in tracebacks.records[before:]] == [], f"{said} logged an error"
