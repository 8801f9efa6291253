"""Fixtures every test shares: an event loop that fails on blocking calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from blockbuster import BlockBuster, blockbuster_ctx


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test in which llmgw's code makes a blocking call inside the event loop."""
    with blockbuster_ctx("llmgw") as bb:
        # A log line written to stderr is the one small write the loop may make.
        for name in ("io.TextIOWrapper.write", "io.BufferedWriter.write"):
            bb.functions[name].can_block_in("llmgw/log.py", "write")
        yield bb
