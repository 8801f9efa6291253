"""Reading an engine's reply within its model's timeouts (gateway/deadlines.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast
from unittest.mock import create_autospec

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from llmgw.config import TimeoutsConfig
from llmgw.gateway.deadlines import Deadlines, EngineTimedOut
from llmgw.gateway.pipeline import Call


def _reply(loop: asyncio.AbstractEventLoop) -> tuple[aiohttp.StreamReader, Any]:
    content = aiohttp.StreamReader(create_autospec(BaseProtocol, instance=True), 2**16, loop=loop)
    return content, SimpleNamespace(content=content)


async def test_bytes_already_received_and_the_end_are_read_without_arming_a_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fast stream's chunks are all in hand: a timer per chunk cost more than passing the chunk on."""
    loop = asyncio.get_running_loop()
    content, upstream = _reply(loop)
    content.feed_data(b"data: {}\n\n")
    content.feed_data(b"data: [DONE]\n\n")
    content.feed_eof()
    deadlines = Deadlines(TimeoutsConfig())
    armed: list[float] = []
    call_at = loop.call_at

    def counted(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counted)
    call = cast(Call, None)  # read only names the call when a deadline passes
    assert await deadlines.read(call, upstream, deadlines.next_byte()) == b"data: {}\n\ndata: [DONE]\n\n"
    assert await deadlines.read(call, upstream, deadlines.next_byte()) == b""
    assert armed == []


async def test_a_read_that_must_wait_still_ends_at_its_deadline() -> None:
    loop = asyncio.get_running_loop()
    _, upstream = _reply(loop)
    deadlines = Deadlines(TimeoutsConfig())
    call = SimpleNamespace(served_model="m", model="m", endpoint="http://127.0.0.1:1", route=None)
    with pytest.raises(EngineTimedOut) as timed_out:
        await deadlines.read(cast(Call, call), upstream, (loop.time() + 0.01, "idle_s"))
    assert timed_out.value.key == "idle_s"
