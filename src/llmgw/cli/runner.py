"""The one place that handles SIGINT and SIGTERM: start the roles, wait, drain, force.

The first signal ends the wait, and the roles drain in reverse order of
starting: the gateway stops taking requests and finishes those in flight, the
agent stops its engines. A second signal forces the exit at once, and even
then no engine is left behind: every engine's process group is killed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TypeVar

import structlog

from llmgw.cli.exit import EXIT_ERROR, EXIT_FORCED, EXIT_OK

log = structlog.get_logger(__name__)

T = TypeVar("T")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Beyond the drain, how long stopping may take (the agent stopping its engines, the
# store closing) before it is forced.
STOP_SLACK_S = 20.0


class Runner:
    """Roles started in order, run until a signal, drained in reverse, forced when they will not stop.

    `async with Runner(drain_s) as runner:` installs the signal handlers; inside,
    `start` enters each role and `wait` returns at the first signal. Leaving drains
    the roles within drain_s plus slack_s; `code` is then EXIT_OK, or EXIT_ERROR when
    the drain ran out of time and was forced. A role that fails to start still has
    the roles before it drained and every engine killed, and its error goes on.
    """

    def __init__(self, drain_s: float, *, slack_s: float = STOP_SLACK_S) -> None:
        self.drain_s = drain_s
        self.limit_s = drain_s + slack_s
        self.code = EXIT_OK
        self._roles = contextlib.AsyncExitStack()
        self._stop = asyncio.Event()
        self._force_hooks: list[Callable[[], None]] = []
        self._signals_seen = 0

    async def __aenter__(self) -> Runner:
        loop = asyncio.get_running_loop()
        for signum in _SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
        return self

    async def start(self, role: AbstractAsyncContextManager[T]) -> T:
        """Start role; it stops when the runner drains, after the roles started later."""
        return await self._roles.enter_async_context(role)

    def on_force(self, hook: Callable[[], None]) -> None:
        """Call hook (it must not block) whenever the exit is forced: kill what must not outlive llmgw."""
        self._force_hooks.append(hook)

    async def wait(self) -> None:
        """Return at the first SIGINT or SIGTERM."""
        await self._stop.wait()

    async def drain(self) -> bool:
        """Stop the roles in reverse order; False when they took longer than limit_s."""
        try:
            async with asyncio.timeout(self.limit_s):
                await self._roles.aclose()
        except TimeoutError:
            log.error("stopping took too long: killing engines", limit_s=self.limit_s)
            return False
        return True

    def force(self) -> None:
        for hook in self._force_hooks:
            hook()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is not None:
                failed = await self._drain_after(exc)
                self.force()
                if failed is not None:
                    raise failed from None
            elif await self.drain():
                log.info("stopped")
            else:
                self.force()
                self.code = EXIT_ERROR
        finally:
            loop = asyncio.get_running_loop()
            for signum in _SIGNALS:
                loop.remove_signal_handler(signum)

    async def _drain_after(self, exc: BaseException) -> Exception | None:
        """Drain after exc ended the run; the error to raise in its place, if it is only a cancellation.

        The error is what the person needs to see, and one in stopping would hide it. But a role
        whose own task fails (the agent's stream, on a key it cannot read) has its task group cancel
        the body waiting in `wait`: exc is then a bare CancelledError naming nothing, and the
        failure comes out of stopping that role.
        """
        try:
            await self.drain()
        except Exception as failed:
            if isinstance(exc, asyncio.CancelledError):
                return failed
        except BaseException:
            pass
        return None

    def _on_signal(self, signum: int) -> None:
        self._signals_seen += 1
        if self._signals_seen == 1:
            log.info("stopping: draining in-flight work; a second signal forces the exit", signal=signum)
            self._stop.set()
            return
        log.warning("forced to stop: killing engines now", signal=signum)
        self.force()
        os._exit(EXIT_FORCED)
