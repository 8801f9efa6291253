"""The admin listener against its own OpenAPI document, fuzzed: no 5xx, nothing undeclared, no traceback.

Schemathesis makes requests from the document (valid ones, and ones that break
it: missing parameters, wrong types, wrong bodies and content types, methods no
path takes) and checks every answer against it, and that none made the server
log an error. The server runs on a loopback port in a thread of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
import schemathesis
import structlog
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

import llmgw
from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.store import Store
from llmgw.web.admin_listener import document, make_admin_app
from llmgw.web.context import WebContext

from ..threaded import ErrorRecords, error_records, serve_in_thread

# Enough to find each class of mistake here in about a minute on two busy cores; every run draws anew.
EXAMPLES = 25

SCHEMA = schemathesis.openapi.from_dict(document(llmgw.__version__))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    unsupported_method,
]


@contextlib.asynccontextmanager
async def _admin_app(store: Store) -> AsyncIterator[web.Application]:
    """The admin listener's app, with a sim model in its catalog."""
    cfg = ServerConfig(admin_listen="127.0.0.1:0", models=[ModelConfig(name="sim-chat")])
    yield make_admin_app(cfg, Inventory(5.0), Catalog(cfg, store), WebContext(cfg=cfg, store=store))


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_in_thread(_admin_app, tmp_path_factory.mktemp("fuzz-admin")) as url:
        yield url


@pytest.fixture(scope="module")
def tracebacks() -> Iterator[ErrorRecords]:
    with error_records() as records:
        yield records


@pytest.mark.slow
@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    # The same cases every run: what CI finds is what was run here; explore with derandomize off.
    derandomize=True,
)
def test_every_answer_of_the_admin_api_is_one_its_document_declares(
    case: schemathesis.Case, admin_url: str, tracebacks: ErrorRecords
) -> None:
    before = len(tracebacks.records)
    with structlog.testing.capture_logs() as logged:
        case.call_and_validate(base_url=admin_url, checks=CHECKS, timeout=30)
    errors = [entry for entry in logged if entry.get("log_level") in ("error", "critical", "exception")]
    logged_by_aiohttp = [r.getMessage() for r in tracebacks.records[before:]]
    assert errors == logged_by_aiohttp == [], (
        f"{case.method} {case.formatted_path} made the server log an error"
    )
