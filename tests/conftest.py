"""Fixtures every test shares: an event loop that fails on blocking calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog
from blockbuster import BlockBuster, blockbuster_ctx

# structlog's default renderer formats exceptions with rich when it is installed (a test tool
# pulls it in), and rich stats source files on the loop; render them as llmgw's own setup does.
structlog.configure(
    processors=[
        structlog.processors.add_log_level,
        structlog.processors.StackInfoRenderer(),
        structlog.dev.set_exc_info,
        structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
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
        yield bb
