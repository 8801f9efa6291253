"""Finding a ready engine that has stalled, without waiting for a request to find it.

An engine stopped with SIGSTOP, or wedged in a driver call, keeps its process
and its port: the kernel still accepts connections to it, so a request sent
there hangs for as long as its client waits, while everything that asks only
"is the process alive?" says ready. A vLLM whose engine core died (its
EngineDeadError) lives on too, answering every request with a 500.

So the agent keeps asking every ready engine, each `agent.probe.interval_s`:

- its health path, within `timeout_s`: `failures` probes in a row that time
  out or fail make it stalled ("llamacpp on n3 stopped answering /health 15 s
  ago ...");
- its metrics page, where its adapter names the series (engines/progress.py):
  requests in flight while none of its work counters moves for `progress_s`
  make it stalled too ("sim on n1 has had 2 requests in flight and produced no
  token for 60 s"), and so does a metrics page that stops answering for as
  long, which is how a llama.cpp whose main loop hangs shows (its /metrics is
  answered by that loop, its /health is not).

Before that, wait_ready asks a starting engine's health path until it answers.

The watch (agent/watch.py) reports a stalled engine, kills its process group
and reports it failed; the control plane places it again under its usual
backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import structlog

from llmgw import launcher
from llmgw.config import ProbeConfig
from llmgw.engines.progress import ProgressMetrics

log = structlog.get_logger(__name__)

# A metrics page that answers but is not usable (404: the engine serves none; 401): no use asking again.
_UNUSABLE = frozenset({401, 403, 404, 405})


def _said(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return str(exc) or type(exc).__name__


def sample_sums(text: str, names: set[str]) -> dict[str, float]:
    """The sum over its samples (every label set) of each name in names found in a Prometheus page."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, rest = line[:space], line[space:]
        if name not in names:
            continue
        fields = rest.split()
        with contextlib.suppress(ValueError, IndexError):
            sums[name] = sums.get(name, 0.0) + float(fields[0])
    return sums


class _Progress:
    """When the engine was last seen working or idle; a reading that cannot be had changes nothing."""

    def __init__(self, now: float) -> None:
        self.since = now
        self.work: float | None = None
        self.in_flight = 0.0
        # Why the last reading failed; empty when it did not.
        self.unreadable = ""

    def saw(self, in_flight: float, work: float, now: float) -> None:
        if in_flight <= 0 or work != self.work:
            self.since = now
        self.work, self.in_flight, self.unreadable = work, in_flight, ""


class Prober:
    """Asks one ready engine its health and its progress until it stalls."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: ProbeConfig,
        *,
        name: str,
        health_url: str,
        metrics_url: str,
        secret: str,
        progress: ProgressMetrics | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """name is the engine and where, as reasons say it ("sim on n1"); secret is for the metrics page."""
        self._session = session
        self._settings = settings
        self._name = name
        self._health_url = health_url
        self._health_path = urlsplit(health_url).path
        self._metrics_url = metrics_url
        self._headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        self._progress_names = progress if settings.progress_s > 0 else None
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_s)

    async def stalled(self) -> str:
        """Probe until the engine stalls, and say how, in words; runs until cancelled otherwise."""
        settings = self._settings
        failed = 0
        first_failed_at = 0.0
        progress = _Progress(self._clock())
        while True:
            started = self._clock()
            error, _ = await asyncio.gather(self._health(), self._read_progress(progress))
            if not error:
                failed = 0
            else:
                if failed == 0:
                    first_failed_at = started
                failed += 1
                if failed >= settings.failures:
                    ago = self._clock() - first_failed_at
                    return (
                        f"{self._name} stopped answering {self._health_path} {ago:.0f} s ago "
                        f"({failed} probes in a row; the last: {error})"
                    )
            reason = self._no_progress(progress)
            if reason:
                return reason
            await asyncio.sleep(max(0.0, settings.interval_s - (self._clock() - started)))

    async def _health(self) -> str:
        """Empty when the health path answered 200 in time, else what went wrong."""
        try:
            async with self._session.get(self._health_url, timeout=self._timeout) as reply:
                if reply.status == 200:
                    return ""
                return f"HTTP {reply.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _said(exc, self._settings.timeout_s)

    async def _read_progress(self, progress: _Progress) -> None:
        names = self._progress_names
        if names is None:
            return
        try:
            async with self._session.get(
                self._metrics_url, headers=self._headers, timeout=self._timeout
            ) as reply:
                if reply.status in _UNUSABLE:
                    log.warning(
                        "an engine's metrics page cannot be read; only its health is probed",
                        url=self._metrics_url,
                        status=reply.status,
                    )
                    self._progress_names = None
                    return
                if reply.status != 200:
                    progress.unreadable = f"HTTP {reply.status}"
                    return
                text = await reply.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            progress.unreadable = _said(exc, self._settings.timeout_s)
            return
        sums = sample_sums(text, {names.in_flight, *names.work})
        if names.in_flight not in sums or not any(name in sums for name in names.work):
            # An engine version without these series: nothing to measure progress by.
            log.warning(
                "an engine's metrics page lacks the series progress is read from; only its health is probed",
                url=self._metrics_url,
                wanted=[names.in_flight, *names.work],
            )
            self._progress_names = None
            return
        progress.saw(sums[names.in_flight], sum(sums.get(name, 0.0) for name in names.work), self._clock())

    def _no_progress(self, progress: _Progress) -> str:
        """Why the engine counts as stalled for want of progress; empty when it does not."""
        if self._progress_names is None:
            return ""
        idle_s = self._clock() - progress.since
        if idle_s < self._settings.progress_s:
            return ""
        if progress.unreadable:
            return (
                f"{self._name} has not answered its metrics page for {idle_s:.0f} s "
                f"(the last try: {progress.unreadable})"
            )
        requests = f"{progress.in_flight:g} request" + ("" if progress.in_flight == 1 else "s")
        return f"{self._name} has had {requests} in flight and produced no token for {idle_s:.0f} s"


async def wait_ready(
    session: aiohttp.ClientSession,
    url: str,
    process: launcher.Process,
    *,
    timeout_s: float,
    interval_s: float,
) -> bool:
    """True once the engine answers its health url; False when it exits or timeout_s is up."""
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=max(1.0, interval_s))
    while True:
        if process.returncode is not None:
            return False
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=timeout) as response:
                if response.status == 200:
                    return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        # Waiting on the process rather than sleeping: an engine that dies is noticed at once.
        # Not wait_for: on 3.11 it swallows a cancel that lands as the process exits, and stop()
        # then waited on a watch that carried on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(interval_s, left)):
                await process.wait()


async def stall_before_exit(process: launcher.Process, prober: Prober) -> str:
    """Why the engine stalled, or "" once its process exits first."""
    exited = asyncio.create_task(process.wait(), name="engine exit")
    stalled = asyncio.create_task(prober.stalled(), name="engine probe")
    try:
        await asyncio.wait({exited, stalled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (exited, stalled):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return stalled.result() if stalled.done() and not stalled.cancelled() else ""
