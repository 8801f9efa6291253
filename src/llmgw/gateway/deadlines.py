"""How long a request may wait on its engine: the model's `timeouts`, as deadlines on each read.

An engine that stops (a stopped process still has its port: the kernel
accepts the connection and takes the request, and nothing ever comes back)
would hold its clients forever: a request waited ten minutes and more on a
SIGSTOPped sim. Each read from the engine is bounded by the nearer of two
deadlines: `first_byte_s` (then `idle_s`) from now, and `total_s` from when
the request was sent. A read past one is an EngineTimedOut, a 504 naming the
model, the node and the key that ran out.
"""

from __future__ import annotations

import asyncio

import aiohttp

from llmgw.config import TimeoutsConfig
from llmgw.gateway.faults import EngineFailed, where
from llmgw.gateway.pipeline import Call


class EngineTimedOut(EngineFailed):
    """The engine sent nothing within one of its model's timeouts (`key` names which).

    An EngineFailed: before the reply's first byte, another replica may take the request.
    """

    def __init__(self, status: int, message: str, key: str) -> None:
        super().__init__(status, message, type="server_error", code="engine_timeout")
        self.key = key


class Deadlines:
    """The deadlines of one request to one engine, from when it is sent."""

    __slots__ = ("_loop", "_timeouts", "_total")

    def __init__(self, timeouts: TimeoutsConfig) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeouts = timeouts
        self._total = self._loop.time() + timeouts.total_s

    def first_byte(self) -> tuple[float, str]:
        """(when, the key it comes from): the deadline for the reply's status line and first bytes."""
        return self._nearer(self._timeouts.first_byte_s, "first_byte_s")

    def next_byte(self) -> tuple[float, str]:
        """The deadline for the next bytes of a reply under way."""
        return self._nearer(self._timeouts.idle_s, "idle_s")

    def _nearer(self, wait_s: float, key: str) -> tuple[float, str]:
        at = self._loop.time() + wait_s
        return (at, key) if at < self._total else (self._total, "total_s")

    def expired(self, call: Call, key: str) -> EngineTimedOut:
        """The 504 for a wait past the deadline from key."""
        seconds = getattr(self._timeouts, key)
        model = call.served_model or call.model
        if key == "total_s":
            said = f"did not finish its reply within {seconds:g} s"
        elif key == "idle_s":
            said = f"sent nothing more for {seconds:g} s"
        else:
            said = f"sent nothing for {seconds:g} s"
        return EngineTimedOut(504, f"{model} on {where(call)} {said} (timeouts.{key})", key)

    async def read(self, call: Call, upstream: aiohttp.ClientResponse, deadline: tuple[float, str]) -> bytes:
        """The engine's next bytes (b"" at the end of its reply), by deadline or an EngineTimedOut."""
        content = upstream.content
        # Bytes already received, or the reply's end, need no wait: a timer armed and cancelled for each
        # of a fast stream's chunks cost the loop more than passing the chunk on.
        ready = content.read_nowait()
        if ready or content.at_eof():
            return ready
        try:
            async with asyncio.timeout_at(deadline[0]):
                return await content.readany()
        except TimeoutError:
            raise self.expired(call, deadline[1]) from None
