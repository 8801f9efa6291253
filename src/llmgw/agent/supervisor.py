"""The supervisor: starts engine processes, watches them, restarts them, stops them.

Each shard is one engine process in its own session (so its process group can
be signalled as a whole: engines fork workers, and a worker left behind holds
the GPU), on a free loopback port. Its output, stdout and stderr merged, is
kept in a ring of the last 500 lines. The supervisor polls the engine's health
path until it answers or `ready_timeout_s` passes, and reports every change
of state through `on_status`:

- starting -> ready (with the endpoint), or
- starting -> failed (with the last output lines) when the engine exits or
  never answers; a shard that never became ready is not restarted, so the
  control plane can place it elsewhere;
- ready -> failed -> starting -> ready when an engine that served crashes:
  it is restarted after a backoff (1 s doubling to 30 s);
- stopped, once `stop` has ended the whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType

import aiohttp
import structlog

from llmgw.engines.base import Engine, LaunchSpec
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

OUTPUT_LINES = 500
# A line longer than this is cut: an engine dumping a tensor must not eat the agent's memory.
_MAX_LINE_CHARS = 4000
# How long to wait for the last output after the process exits; a grandchild that kept
# the pipe open must not hold up the failure report.
_OUTPUT_DRAIN_S = 1.0


def _free_port(host: str) -> int:
    """A port nothing listens on now. The engine binds it a moment later; another process
    could take it in between, and then the engine fails to start and is reported."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _seconds(s: float) -> str:
    return f"{s:.3g} s"


class _Shard:
    """One shard's request, process, output and last reported status."""

    def __init__(self, req: pb.StartShard, engine: Engine):
        self.req = req
        self.engine = engine
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.process: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.endpoint = ""
        self.status = pb.ShardStatus()

    @property
    def name(self) -> str:
        return f"{self.engine.name} for {self.req.model} (shard {self.req.shard_id})"


class Supervisor:
    """Starts, watches and stops engine processes; usable as `async with`."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        on_status: Callable[[pb.ShardStatus], None] | None = None,
        ready_timeout_s: float = 120.0,
        *,
        stop_grace_s: float = 10.0,
        host: str = "127.0.0.1",
        health_interval_s: float = 0.1,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
    ):
        self._engines = engines
        # Settable after construction: the agent client that forwards statuses needs the
        # supervisor to exist first. Reports made while it is None are kept in statuses() only.
        self.on_status = on_status
        self._ready_timeout_s = ready_timeout_s
        self._stop_grace_s = stop_grace_s
        self._host = host
        self._health_interval_s = health_interval_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._shards: dict[str, _Shard] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- what the agent calls -------------------------------------------------------------

    async def start(self, req: pb.StartShard) -> None:
        """Start the engine for req; returns once the process is spawned (or has failed to be).

        A shard that is already running is left alone: the control plane may resend a
        StartShard after a reconnect, and that must not restart a serving engine. A shard
        that failed for good is started afresh.
        """
        if self._closed:
            raise RuntimeError("the supervisor is closed")
        running = self._shards.get(req.shard_id)
        if running is not None:
            if running.status.state != "failed" or (running.task is not None and not running.task.done()):
                return
            # It failed for good; starting it again is a fresh start.
            await self.stop(req.shard_id)
        engine = self._engines.get(req.engine)
        if engine is None:
            known = ", ".join(sorted(self._engines)) or "none"
            status = self._status_for(req, req.engine, "failed")
            status.detail = f"this node has no engine called {req.engine!r} (it has: {known})"
            self._report(status)
            return
        shard = _Shard(req, engine)
        self._shards[req.shard_id] = shard
        if not await self._spawn(shard, restarting=False):
            return
        if self._shards.get(req.shard_id) is not shard:
            # Stopped (or the supervisor closed) while it was being spawned: it must not outlive that.
            await self._terminate(shard)
            self._report(self._status(shard, "stopped"))
            return
        shard.task = asyncio.create_task(self._watch(shard), name=f"supervise {req.shard_id}")

    async def stop(self, shard_id: str) -> None:
        """End the shard's whole process group (SIGTERM, SIGKILL after the grace) and report it stopped."""
        shard = self._shards.pop(shard_id, None)
        if shard is None:
            return
        if shard.task is not None:
            shard.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shard.task
        detail = "stopped"
        if shard.process is not None:
            returncode = await self._terminate(shard)
            detail = f"stopped ({shard.engine.name} {_exit_reason(returncode)})"
        status = self._status(shard, "stopped")
        status.detail = detail
        self._report(status)

    async def aclose(self) -> None:
        """Stop every shard, in parallel, and release the health-check session."""
        self._closed = True
        await asyncio.gather(*(self.stop(shard_id) for shard_id in list(self._shards)))
        if self._session is not None:
            await self._session.close()
            self._session = None

    def kill_all(self) -> None:
        """SIGKILL every engine's process group now, without waiting: for a forced exit."""
        for shard in self._shards.values():
            if shard.process is not None and shard.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(shard.process.pid, signal.SIGKILL)

    def statuses(self) -> list[pb.ShardStatus]:
        """The last reported status of every shard this supervisor runs."""
        return [shard.status for shard in self._shards.values()]

    def output(self, shard_id: str) -> list[str]:
        """The shard's last output lines (at most 500), oldest first; empty for an unknown shard."""
        shard = self._shards.get(shard_id)
        return list(shard.output) if shard is not None else []

    def sources(self) -> list[str]:
        """The shards whose output can be read."""
        return list(self._shards)

    # --- one shard's life -----------------------------------------------------------------

    async def _spawn(self, shard: _Shard, *, restarting: bool) -> bool:
        """Start shard's process and report starting; on failure report failed and say False."""
        req = shard.req
        port = _free_port(self._host)
        spec = LaunchSpec(
            model=req.model,
            port=port,
            host=self._host,
            args=tuple(req.args),
            env=tuple(req.env.items()),
            gpu_indices=tuple(req.gpu_indices),
            context_size=req.context_size,
            parallel=req.parallel,
            rank=req.rank,
            world_size=req.world_size or 1,
            master_addr=req.master_addr,
            master_port=req.master_port,
        )
        argv = shard.engine.command(spec)
        env = {**os.environ, **shard.engine.environment(spec)}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            status = self._status(shard, "failed")
            status.detail = f"could not start {shard.engine.name}: {argv[0]}: {e.strerror or e}"
            status.last_output = list(shard.output)
            self._report(status)
            return False
        shard.process = process
        shard.reader = asyncio.create_task(self._read_output(shard, process), name=f"output {req.shard_id}")
        shard.endpoint = f"http://{self._host}:{port}"
        status = self._status(shard, "starting")
        status.pid = process.pid
        again = "restarting" if restarting else "starting"
        status.detail = f"{again} {shard.engine.name} (pid {process.pid}) on port {port}"
        self._report(status)
        log.info("engine starting", shard=req.shard_id, engine=shard.engine.name, pid=process.pid, argv=argv)
        return True

    async def _watch(self, shard: _Shard) -> None:
        """Wait for ready, then for an exit; restart an engine that had served, with backoff."""
        backoff = self._backoff_initial_s
        served = False
        while True:
            process = shard.process
            assert process is not None
            became_ready = await self._wait_ready(shard, process)
            health = shard.engine.health_path
            if became_ready:
                served = True
                ready = self._status(shard, "ready")
                ready.endpoint = shard.endpoint
                ready.pid = process.pid
                ready.detail = f"{shard.engine.name} answers on {shard.endpoint}"
                self._report(ready)
                log.info("engine ready", shard=shard.req.shard_id, endpoint=shard.endpoint)
                ready_at = time.monotonic()
                await process.wait()
                # An engine that served a good while before crashing starts over at the short backoff.
                if time.monotonic() - ready_at >= self._backoff_max_s:
                    backoff = self._backoff_initial_s
            timed_out = not became_ready and process.returncode is None
            # Also for an engine that exited by itself: the workers it forked go with it.
            returncode = await self._terminate(shard)
            shard.process = None
            name = shard.engine.name
            failed = self._status(shard, "failed")
            failed.pid = process.pid
            failed.last_output = list(shard.output)
            if timed_out:
                failed.detail = f"{name} did not answer {health} within {_seconds(self._ready_timeout_s)}"
            elif became_ready:
                failed.detail = f"{name} {_exit_reason(returncode)} after serving"
            else:
                failed.detail = f"{name} {_exit_reason(returncode)} before answering {health}"
            if served:
                failed.detail += f"; restarting in {_seconds(backoff)}"
            self._report(failed)
            log.warning("engine failed", shard=shard.req.shard_id, detail=failed.detail)
            if not served:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._backoff_max_s)
            if not await self._spawn(shard, restarting=True):
                return

    async def _wait_ready(self, shard: _Shard, process: asyncio.subprocess.Process) -> bool:
        """True once the engine answers its health path; False when it exits or the time is up."""
        url = shard.endpoint + shard.engine.health_path
        session = self._health_session()
        deadline = time.monotonic() + self._ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=max(1.0, self._health_interval_s))
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), timeout=min(self._health_interval_s, left))

    def _health_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Engines answer on loopback only; a proxy from the environment must not get in the way.
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def _read_output(self, shard: _Shard, process: asyncio.subprocess.Process) -> None:
        """Keep the process's output lines; split by hand so one huge line cannot break the reader."""
        stream = process.stdout
        assert stream is not None
        pending = b""
        while chunk := await stream.read(65536):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if len(pending) > _MAX_LINE_CHARS:
                lines.append(pending)
                pending = b""
            for line in lines:
                shard.output.append(line[:_MAX_LINE_CHARS].decode(errors="replace").rstrip("\r"))
        if pending:
            shard.output.append(pending[:_MAX_LINE_CHARS].decode(errors="replace").rstrip("\r"))

    async def _drain_output(self, shard: _Shard) -> None:
        """Let the reader take the last lines of an exited process, then end it."""
        reader, shard.reader = shard.reader, None
        if reader is None:
            return
        await asyncio.wait({reader}, timeout=_OUTPUT_DRAIN_S)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader

    async def _terminate(self, shard: _Shard) -> int:
        """SIGTERM the process group, SIGKILL it after the grace; the leader's return code."""
        process = shard.process
        assert process is not None
        # The group id is the leader's pid (start_new_session); the kernel keeps that id from being
        # reused while any member lives, so signalling it after the leader is gone is still safe.
        pgid = process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=self._stop_grace_s)
        except TimeoutError:
            log.warning("engine ignored SIGTERM; killing it", shard=shard.req.shard_id, pid=pgid)
        # Also when the leader exited in time: a worker it left behind would hold the port or the GPU.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        returncode = await process.wait()
        await self._drain_output(shard)
        return returncode

    # --- reporting ------------------------------------------------------------------------

    @staticmethod
    def _status_for(req: pb.StartShard, engine: str, state: str) -> pb.ShardStatus:
        return pb.ShardStatus(
            shard_id=req.shard_id,
            model=req.model,
            engine=engine,
            state=state,
            gpu_indices=list(req.gpu_indices),
            profile=req.profile,
            replica_id=req.replica_id,
            rank=req.rank,
        )

    def _status(self, shard: _Shard, state: str) -> pb.ShardStatus:
        return self._status_for(shard.req, shard.engine.name, state)

    def _report(self, status: pb.ShardStatus) -> None:
        shard = self._shards.get(status.shard_id)
        if shard is not None:
            shard.status = status
        if self.on_status is None:
            return
        try:
            self.on_status(status)
        except Exception:
            # The reporter is the agent's stream; a hiccup there must not orphan a running engine.
            log.exception("reporting a shard status failed", shard=status.shard_id, state=status.state)
