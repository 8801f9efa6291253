"""The test run itself refuses llmgw code that blocks the event loop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockingError

import llmgw

_SOURCE = """
async def sleeps_in_the_loop():
    time.sleep(0.001)
"""


async def test_a_blocking_call_inside_the_event_loop_fails_the_test() -> None:
    # Compiled as if it were a module of the package, which is what blockbuster watches.
    namespace: dict[str, Any] = {"time": time}
    exec(compile(_SOURCE, str(Path(llmgw.__path__[0]) / "_blocking_probe.py"), "exec"), namespace)
    with pytest.raises(BlockingError):
        await namespace["sleeps_in_the_loop"]()
