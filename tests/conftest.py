"""Fixtures every test shares: an event loop that fails on blocking calls, the programs tests run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from blockbuster import BlockBuster, blockbuster_ctx

# Every skip but needs.root's fails; the llama-server build as a fixture (tests/needs.py).
from .needs import llama_server, pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from .postgres import Cluster, running_cluster
from .postgres import unavailable as postgres_unavailable

# vLLM as the agent installs it, for the tests that run it (tests/vllm_env.py).
from .vllm_env import vllm_python  # noqa: F401

# tests/test_needs.py runs small suites of its own.
pytest_plugins = ["pytester"]

# Tests log through structlog's default setup, whose console renderer hands a traceback to rich
# when rich is installed (schemathesis brings it); rich stats every file of the stack, on the loop,
# and blockbuster fails the test. llmgw's own setup (log.setup) formats tracebacks plainly first;
# the tests' default must too.
structlog.configure(
    processors=[
        *structlog.get_config()["processors"][:-1],
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
    ]
)


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test in which llmgw's code makes a blocking call inside the event loop."""
    with blockbuster_ctx("llmgw") as bb:
        # A log line written to stderr is the one small write the loop may make.
        for name in ("io.TextIOWrapper.write", "io.BufferedWriter.write"):
            bb.functions[name].can_block_in("llmgw/log.py", "write")
        # asyncpg looks for ~/.pgpass and ~/.postgresql/root.crt (a few stats of the home directory)
        # as it opens each connection of the store's pool: per connection, never per statement.
        for function in bb.functions.values():
            function.can_block_in("asyncpg/connect_utils.py", "_parse_connect_dsn_and_args")
        yield bb


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster for the whole session (tests/postgres.py)."""
    why = postgres_unavailable()
    if why:
        pytest.fail(why, pytrace=False)
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def postgres_url(postgres: Cluster) -> str:
    """The URL of an empty database of this test's own on the session's cluster."""
    return postgres.fresh_database()


if os.environ.get("LLMGW_TEST_LOOP") == "uvloop":
    # The suite on uvloop's loop instead of asyncio's own (llmgw serve --loop uvloop).
    import uvloop

    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
        return {"uvloop": uvloop.new_event_loop}
