"""The admin API against its own OpenAPI document, fuzzed on both listeners: no 5xx, nothing undeclared.

Schemathesis makes requests from the document (valid ones, and ones that break
it: missing parameters, wrong types, wrong bodies and content types, methods no
path takes) and checks every answer against it: its status and body are ones
the document declares, a request the document allows is not refused as bad
(400), one it forbids is refused, and none made the server log an error. The
admin listener is fuzzed, and /admin on the client port with an admin token
(its pages need a session, and tests/web/test_cluster.py holds them). Each
server runs on a loopback port in a thread of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import schemathesis
import structlog
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

import llmgw
from llmgw.adminapi import capacity
from llmgw.adminapi.auth import hash_token
from llmgw.capacity.shape import ModelShape
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.errors import LlmgwError
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.store import Store
from llmgw.web.admin_listener import document, make_admin_app
from llmgw.web.client_port import ADMIN, mount_client_port
from llmgw.web.context import WebContext

from ..threaded import ErrorRecords, error_records, serve_in_thread

# Enough to find each class of mistake here in about a minute on two busy cores, for both listeners.
EXAMPLES = 15
TOKEN = "fuzz-admin-token"

SCHEMA = schemathesis.openapi.from_dict(document(llmgw.__version__))
# The client port's pages need an administrator's session, not a token: the API alone is fuzzed there.
API_SCHEMA = schemathesis.openapi.from_dict(document(llmgw.__version__)).exclude(tag="pages")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    unsupported_method,
]
# A model's definition is checked by the config loader (an engine that exists, a profile's fields
# that fit it), which no JSON Schema of the body says: a definition the document allows may be a 400.
_DEFINITION_CHECKS = [check for check in CHECKS if check is not positive_data_acceptance]
_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    # The same cases every run: what CI finds is what was run here; explore with derandomize off.
    derandomize=True,
)


@contextlib.asynccontextmanager
async def _admin_app(store: Store) -> AsyncIterator[web.Application]:
    """The admin listener's app, with a sim model in its catalog."""
    cfg = ServerConfig(admin_listen="127.0.0.1:0", models=[ModelConfig(name="sim-chat")])
    yield make_admin_app(cfg, Inventory(5.0), Catalog(cfg, store), WebContext(cfg=cfg, store=store))


@contextlib.asynccontextmanager
async def _client_port_app(store: Store) -> AsyncIterator[web.Application]:
    """The gateway's app with the pages and /admin mounted, as the server role makes it; an admin token."""
    cfg = ServerConfig(models=[ModelConfig(name="sim-chat")], admin_tokens=[hash_token(TOKEN)])
    catalog = Catalog(cfg, store)
    inventory = Inventory(5.0)
    app = make_gateway_app(cfg, catalog, inventory, KeyCache())
    mount_client_port(app, cfg, inventory, catalog, WebContext(cfg=cfg, store=store))
    yield app


@pytest.fixture(scope="module", autouse=True)
def no_headers_fetched() -> Iterator[None]:
    """The fuzzer adds models with any http(s) source and asks their capacity: the server would fetch
    from wherever it names. Nothing is fetched here; the reader's refusal is what the route answers."""

    async def refused(source: str, *_: Any) -> ModelShape:
        raise LlmgwError(f"{source}: the fuzz test reads no headers")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "remote_shape", refused)
        yield


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_in_thread(_admin_app, tmp_path_factory.mktemp("fuzz-admin")) as url:
        yield url


@pytest.fixture(scope="module")
def client_port_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_in_thread(_client_port_app, tmp_path_factory.mktemp("fuzz-client-port")) as url:
        yield url + ADMIN


@pytest.fixture(scope="module")
def tracebacks() -> Iterator[ErrorRecords]:
    with error_records() as records:
        yield records


def _call(case: schemathesis.Case, base_url: str, tracebacks: ErrorRecords, **kwargs: Any) -> None:
    """Make the case's request and check the answer; fail too when the server logged an error."""
    checks = _DEFINITION_CHECKS if case.operation.definition.raw.get("operationId") == "addModel" else CHECKS
    before = len(tracebacks.records)
    with structlog.testing.capture_logs() as logged:
        case.call_and_validate(base_url=base_url, checks=checks, timeout=30, **kwargs)
    errors = [entry for entry in logged if entry.get("log_level") in ("error", "critical", "exception")]
    logged_by_aiohttp = [r.getMessage() for r in tracebacks.records[before:]]
    assert errors == logged_by_aiohttp == [], (
        f"{case.method} {case.formatted_path} made the server log an error"
    )


@pytest.mark.slow
@SCHEMA.parametrize()
@_SETTINGS
def test_every_answer_of_the_admin_api_is_one_its_document_declares(
    case: schemathesis.Case, admin_url: str, tracebacks: ErrorRecords
) -> None:
    _call(case, admin_url, tracebacks)


@pytest.mark.slow
@API_SCHEMA.parametrize()
@_SETTINGS
def test_every_answer_of_the_admin_api_on_the_client_port_is_one_its_document_declares(
    case: schemathesis.Case, client_port_url: str, tracebacks: ErrorRecords
) -> None:
    _call(case, client_port_url, tracebacks, headers={"Authorization": f"Bearer {TOKEN}"})
