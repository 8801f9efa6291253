"""The supervisor: starts engine processes, watches them, says why they failed, stops them.

Each shard is one engine process, started by llmgw's launcher in its own
session (so its process group can be signalled as a whole: engines fork
workers, and a worker left behind holds the GPU), on a free port of
agent.yaml's `engine_ports`, listening on `engine_bind` and advertised at the
node's address (the one the control plane reaches it at: agent/client.py tells
the supervisor once connected), and requiring the replica's secret of its
callers. Its output, stdout and stderr merged, goes to a log file under `state_dir`
(agent/state.py: that is what lets an engine outlive the agent and be adopted
by the next one); the supervisor follows the file and keeps a ring of its last
500 lines. It polls the engine's health path until it answers or
`ready_timeout_s` passes, and reports every change of state through
`on_status`:

- starting -> ready (with the endpoint), or
- starting -> failed (with the last output lines) when the engine exits or
  never answers;
- ready -> failed (with the last output lines) when an engine that served
  exits;
- ready -> stalled -> failed when a served engine stops answering its health
  path or stops producing tokens (agent/probe.py): its process group is killed
  between the two;
- stopped, once `stop` has ended the whole process group.

A failed shard is not restarted here: the control plane stops it and places
its replica again, elsewhere at once and on this node after
`control.base_backoff_s` (doubling). An agent restarting it as well would race
that decision, on a node the model is meant to stay off for a while.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import os
import random
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import aiohttp
import attrs
import structlog

from llmgw import launcher
from llmgw.addresses import DEFAULT_ENGINE_PORTS, parse_port_range, url_host
from llmgw.agent import state as engine_state
from llmgw.agent.probe import Prober, stall_before_exit
from llmgw.agent.weights import WeightsCache, WeightsError
from llmgw.config import ProbeConfig
from llmgw.engines.base import Engine, LaunchSpec, last_words
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

OUTPUT_LINES = 500
# A line longer than this is cut: an engine dumping a tensor must not eat the agent's memory.
_MAX_LINE_CHARS = 4000
# How long to wait for the last output after the process exits; a grandchild that kept
# the pipe open must not hold up the failure report.
_OUTPUT_DRAIN_S = 1.0


_DEFAULT_PORTS = parse_port_range(DEFAULT_ENGINE_PORTS)
_DEFAULT_PROBE = ProbeConfig()


class NoFreePort(LlmgwError):
    """Every port of engine_ports is taken on the bind address."""


def _free_port(host: str, ports: range, taken: set[int]) -> int:
    """A port of ports nothing listens on now on host, nor handed to another shard here.

    The engine binds it a moment later; another process could take it in between, and
    then the engine fails to start and is reported.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # From a random place in the range: an engine restarted at once does not retry the port
    # its predecessor may still hold in TIME_WAIT, and two agents on one host rarely collide.
    start = random.randrange(len(ports))
    last_error = ""
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        if port in taken:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as exc:
                last_error = exc.strerror or str(exc)
                continue
            return port
    span = f"{ports.start}-{ports.stop - 1}"
    why = f"all {len(ports)} are taken" + (f" (the last said: {last_error})" if last_error else "")
    raise NoFreePort(f"no free port in engine_ports {span} on {host}: {why}")


def _on_this_machine(bind: str) -> str:
    """The address that reaches an engine listening on bind from this machine: loopback for a wildcard."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)


def _redacted(lines: list[str], secret: str) -> list[str]:
    """lines with the replica's secret blotted out, for a log or a page."""
    if not secret:
        return lines
    return [line.replace(secret, "[secret]") for line in lines]


def _exit_reason(returncode: int) -> str:
    if returncode == launcher.UNKNOWN_EXIT:
        return "exited (it was adopted from the previous agent, so how is unknown)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _seconds(s: float) -> str:
    return f"{s:.3g} s"


def _port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port now (blocking: run in a thread)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # A connection the exited engine left in TIME_WAIT does not count as the port in use.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            # Only "in use": an address that is not this machine's is another failure, not this one.
            return exc.errno == errno.EADDRINUSE
    return False


@attrs.frozen
class MetricsTarget:
    """A ready engine's metrics page: what the agent's /metrics re-exports, labelled with its replica."""

    shard_id: str
    model: str
    replica: str
    url: str
    secret: str = attrs.field(repr=False)


class _Shard:
    """One shard's request, process, output and last reported status."""

    def __init__(self, req: pb.StartShard, engine: Engine):
        self.req = req
        self.engine = engine
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.process: launcher.Process | None = None
        # Where the weights are on disk, once fetched.
        self.model_path = ""
        self.reader: asyncio.Task[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.endpoint = ""
        # Where the agent itself reaches the engine (its health): the bind address, which the
        # advertised one (a NAT's, say) need not route back to.
        self.local_url = ""
        # The port handed to this shard's engine, so no other shard is given it while it starts.
        self.port = 0
        self.status = pb.ShardStatus()

    @property
    def name(self) -> str:
        return f"{self.engine.name} for {self.req.model} (shard {self.req.shard_id})"


# The output of shards that ended, kept for `llmgw ctl logs NODE --source SHARD`: the output of a
# failed engine is what explains it, and the control plane stops a failed shard at once.
ENDED_KEPT = 16


class Supervisor:
    """Starts, watches and stops engine processes; usable as `async with`."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        on_status: Callable[[pb.ShardStatus], None] | None = None,
        ready_timeout_s: float = 120.0,
        *,
        state_dir: Path,
        stop_grace_s: float = 10.0,
        host: str = "127.0.0.1",
        bind: str = "",
        ports: range = _DEFAULT_PORTS,
        health_interval_s: float = 0.1,
        binaries: Callable[[str], str] | None = None,
        parallel: Callable[[str], int] | None = None,
        weights: WeightsCache | None = None,
        keep_on_close: bool = False,
        probe: ProbeConfig = _DEFAULT_PROBE,
        node: str = "",
    ):
        # How ready engines are watched for a stall, and the node's name the reasons give.
        self._probe = probe
        self._node = node
        # Engines write their output to files under state_dir and the state file there lists them,
        # so they can outlive this agent; keep_on_close leaves them running when it stops.
        self._weights = weights
        self._state_dir = state_dir
        self._keep_on_close = keep_on_close
        self._state_lock = asyncio.Lock()
        self._engines = engines
        # Engine name -> the executable to run (what the provision loop installed, or agent.yaml
        # names), asked at each spawn: an engine installed after the agent started is still found.
        self._binaries = binaries
        # Engine name -> agent.yaml's engines.<name>.parallel, for a StartShard that sets none:
        # left at 0, llama.cpp would serve one request at a time.
        self._parallel = parallel
        # Settable after construction: the agent client that forwards statuses needs the
        # supervisor to exist first. Reports made while it is None are kept in statuses() only.
        self.on_status = on_status
        self._ready_timeout_s = ready_timeout_s
        self._stop_grace_s = stop_grace_s
        # The address engines are advertised at (their endpoints' host), until advertise() says
        # otherwise; bind is where they listen, the advertised address when empty.
        self._host = host
        self._bind = bind
        self._ports = ports
        self._health_interval_s = health_interval_s
        self._shards: dict[str, _Shard] = {}
        # Shards stop() has taken from _shards and is still ending: a forced exit in that window
        # (a second signal during a drain) must kill them too, or an engine outlived its agent.
        self._stopping: dict[str, _Shard] = {}
        # shard id -> the last output lines of a shard that ended here, the newest ENDED_KEPT.
        self._ended: dict[str, list[str]] = {}
        # Engines that crashed after serving, by model, since the agent started (the control plane
        # starts them again): what the agent's metrics page counts as restarts.
        self.restarts: collections.Counter[str] = collections.Counter()
        # The process groups a clean stop left running for the next agent: a second signal that
        # comes while the rest of llmgw still drains must still find them to kill.
        self._left_running: list[int] = []
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
        if req.source and self._weights is not None:
            # In the shard's own task: a download takes minutes, and the stream that delivered this
            # request must stay free for the next one (the StopShard that cancels it, say).
            shard.task = asyncio.create_task(self._fetch_and_run(shard), name=f"supervise {req.shard_id}")
            return
        if not await self._spawn(shard):
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
        self._stopping[shard_id] = shard
        try:
            await self._end(shard_id, shard)
        finally:
            self._stopping.pop(shard_id, None)
        await self._save_state()

    async def _end(self, shard_id: str, shard: _Shard) -> None:
        if shard.task is not None:
            shard.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shard.task
        detail = "stopped"
        if shard.process is not None:
            returncode = await self._terminate(shard)
            detail = f"stopped ({shard.engine.name} {_exit_reason(returncode)})"
        self._keep_output(shard_id, list(shard.output))
        status = self._status(shard, "stopped")
        status.detail = detail
        self._report(status)

    async def aclose(self) -> None:
        """Stop every shard, in parallel, and release the health-check session."""
        self._closed = True
        if self._keep_on_close:
            await self._leave_running()
        else:
            await asyncio.gather(*(self.stop(shard_id) for shard_id in list(self._shards)))
        if self._session is not None:
            await self._session.close()
            self._session = None

    def leave_engines_on_close(self) -> None:
        """Leave every engine running when this closes, for the agent that execs in (an upgrade)."""
        self._keep_on_close = True

    def kill_all(self) -> None:
        """SIGKILL every engine's process group now, without waiting: for a forced exit.

        Those a clean stop already left running for the next agent too: a forced exit leaves none.
        """
        for shard in (*self._shards.values(), *self._stopping.values()):
            if shard.process is not None and shard.process.returncode is None:
                launcher.kill_group(shard.process.pid)
        for pid in self._left_running:
            launcher.kill_group(pid)

    def forget_engines(self) -> None:
        """Empty the state file after kill_all(): no engine is left for the next agent to adopt.

        Blocking, on purpose: it is the last thing a forced exit does before the process ends. A
        state file still listing the killed engines had the next agent look for processes long gone.
        """
        with contextlib.suppress(OSError):
            engine_state.write_state(self._state_dir, [])

    def advertise(self, address: str) -> None:
        """Advertise engines started from now on at address: the node's, as the control plane reaches it.

        Engines already running keep their endpoint: an agent that reconnects through another
        server address may see another local address, and a serving engine must not move.
        """
        if address and address != self._host:
            log.info("engines are advertised at a new address", address=address, previous=self._host)
            self._host = address

    def statuses(self) -> list[pb.ShardStatus]:
        """The last reported status of every shard this supervisor runs."""
        return [shard.status for shard in self._shards.values()]

    def metrics_targets(self) -> list[MetricsTarget]:
        """Where each ready engine's own metrics page is, as the agent reaches it, with its secret."""
        return [
            MetricsTarget(
                shard_id=shard.req.shard_id,
                model=shard.req.model,
                replica=shard.req.replica_id or shard.req.shard_id,
                url=shard.local_url + shard.engine.metrics_path,
                secret=shard.req.engine_secret,
            )
            for shard in self._shards.values()
            if shard.status.state == "ready" and shard.local_url
        ]

    def output(self, shard_id: str) -> list[str]:
        """The shard's last output lines (at most 500), oldest first; empty for an unknown shard.

        A shard that ended here still has its output for a while (the last ENDED_KEPT).
        """
        shard = self._shards.get(shard_id)
        if shard is not None:
            return list(shard.output)
        return list(self._ended.get(shard_id, ()))

    def sources(self) -> list[str]:
        """The shards whose output can be read: those running, then those that ended lately."""
        return [*self._shards, *(s for s in self._ended if s not in self._shards)]

    def _keep_output(self, shard_id: str, lines: list[str]) -> None:
        if not lines:
            return
        self._ended.pop(shard_id, None)
        self._ended[shard_id] = lines
        while len(self._ended) > ENDED_KEPT:
            del self._ended[next(iter(self._ended))]

    # --- one shard's life -----------------------------------------------------------------

    async def _spawn(self, shard: _Shard) -> bool:
        """Start shard's process and report starting; on failure report failed and say False."""
        req = shard.req
        bind = self._bind or self._host
        taken = {other.port for other in self._shards.values() if other is not shard}
        try:
            port = await asyncio.to_thread(_free_port, bind, self._ports, taken)
        except NoFreePort as exc:
            status = self._status(shard, "failed")
            status.detail = str(exc)
            self._report(status)
            return False
        shard.port = port
        spec = LaunchSpec(
            model=req.model,
            port=port,
            host=bind,
            args=tuple(req.args),
            env=tuple(req.env.items()),
            gpu_indices=tuple(req.gpu_indices),
            context_size=req.context_size,
            parallel=req.parallel or (self._parallel(req.engine) if self._parallel is not None else 0),
            rank=req.rank,
            world_size=req.world_size or 1,
            master_addr=req.master_addr,
            master_port=req.master_port,
            model_path=shard.model_path,
            binary=self._binaries(req.engine) if self._binaries is not None else "",
            secret=req.engine_secret,
        )
        try:
            argv = shard.engine.command(spec)
        except LlmgwError as e:
            # The adapter refusing this replica (no model file, say) fails the one shard,
            # not the agent's stream that delivered it.
            status = self._status(shard, "failed")
            status.detail = str(e)
            self._report(status)
            return False
        path = engine_state.log_path(self._state_dir, req.shard_id)
        try:
            # A file, not a pipe the agent holds: a pipe whose reader is gone (the agent restarting)
            # kills the engine with SIGPIPE at its next line.
            log_fd = await engine_state.open_log(path)
            try:
                process = await launcher.start(argv, env=shard.engine.environment(spec), stdout=log_fd)
            finally:
                os.close(log_fd)
        except OSError as e:
            self._report_spawn_failure(shard, argv, e)
            return False
        shard.process = process
        shard.reader = asyncio.create_task(
            self._follow(shard, path, process.pid), name=f"output {req.shard_id}"
        )
        shard.endpoint = f"http://{url_host(self._host)}:{port}"
        shard.local_url = f"http://{url_host(_on_this_machine(bind))}:{port}"
        status = self._status(shard, "starting")
        status.pid = process.pid
        status.detail = f"starting {shard.engine.name} (pid {process.pid}) on port {port}"
        self._report(status)
        log.info(
            "engine starting",
            shard=req.shard_id,
            engine=shard.engine.name,
            pid=process.pid,
            argv=_redacted(argv, req.engine_secret),
        )
        await self._save_state()
        return True

    # --- engines that outlive the agent (agent/state.py), and their weights ---------------

    async def adopt(self) -> list[str]:
        """Take over the engines the previous agent left running (its state file); the shard ids adopted.

        An engine is adopted when its pid is still the process the state file names; it is then
        watched like one started here, and reported ready once it answers its health path again.
        """
        records = await asyncio.to_thread(engine_state.read_state, self._state_dir)
        adopted = []
        for record in records:
            req = record.request
            engine = self._engines.get(req.engine)
            alive = await asyncio.to_thread(engine_state.still_running, record)
            if not alive or engine is None or req.shard_id in self._shards:
                log.info(
                    "the previous agent's engine is gone; not adopting it", shard=req.shard_id, pid=record.pid
                )
                continue
            shard = _Shard(req, engine)
            shard.process = launcher.adopt(record.pid)
            shard.endpoint = shard.local_url = record.endpoint
            source_path = self._weights.path_of(req.source, req.sha256) if self._weights is not None else None
            shard.model_path = str(source_path) if source_path is not None else ""
            self._shards[req.shard_id] = shard
            shard.reader = asyncio.create_task(
                self._follow(shard, Path(record.log), record.pid), name=f"output {req.shard_id}"
            )
            status = self._status(shard, "starting")
            status.pid = record.pid
            status.detail = (
                f"adopted {engine.name} (pid {record.pid}) from the previous agent; "
                f"checking that it answers on {record.endpoint}"
            )
            self._report(status)
            log.info("adopted an engine the previous agent left running", shard=req.shard_id, pid=record.pid)
            shard.task = asyncio.create_task(self._watch(shard), name=f"supervise {req.shard_id}")
            adopted.append(req.shard_id)
        await self._save_state()
        return adopted

    def weights_in_use(self) -> set[str]:
        """The weight sources of every shard this supervisor runs or is fetching for."""
        return {shard.req.source for shard in self._shards.values() if shard.req.source}

    async def remove_weights(self, sources: list[str]) -> tuple[list[str], list[str]]:
        """Delete weights no engine here uses; (removed, kept with the reason)."""
        if self._weights is None:
            return [], [f"{source} (this node has no weights cache)" for source in sources]
        return await self._weights.remove(sources, self.weights_in_use())

    async def _fetch_and_run(self, shard: _Shard) -> None:
        """Fetch the shard's weights (reporting progress as state downloading), then start and watch it."""
        req = shard.req
        assert self._weights is not None

        def progress(text: str) -> None:
            status = self._status(shard, "downloading")
            status.detail = text
            self._report(status)

        progress(f"fetching {req.source}")
        try:
            path = await self._weights.fetch(req.source, req.sha256, progress)
        except (WeightsError, OSError) as exc:
            failed = self._status(shard, "failed")
            if isinstance(exc, OSError):
                failed.detail = f"weights {req.source}: writing them failed: {exc.strerror or exc}"
            else:
                failed.detail = str(exc)
            self._report(failed)
            log.warning("weights could not be fetched", shard=req.shard_id, detail=failed.detail)
            return
        try:
            # An engine that loads one file of a directory of weights (llama.cpp's GGUF, from the
            # mirror) picks it; the others are given the directory.
            path = await asyncio.to_thread(shard.engine.model_file, path)
        except LlmgwError as exc:
            failed = self._status(shard, "failed")
            failed.detail = str(exc)
            self._report(failed)
            return
        shard.model_path = str(path)
        if not await self._spawn(shard):
            return
        await self._watch(shard)

    async def _follow(self, shard: _Shard, path: Path, pid: int) -> None:
        """Keep the output lines of an engine that writes to a file."""
        tail = await engine_state.follow_log(path, pid)
        try:
            await self._read_output(shard, tail)
        finally:
            await engine_state.end_follower(tail)

    async def _save_state(self) -> None:
        """Rewrite the state file with every engine process alive now."""
        state_dir = self._state_dir
        alive = [
            (shard.req, shard.process.pid, shard.endpoint)
            for shard in self._shards.values()
            if shard.process is not None and shard.process.returncode is None
        ]

        def write() -> None:
            records = []
            for req, pid, endpoint in alive:
                started = engine_state.process_start_time(pid)
                if started is not None:
                    log_file = str(engine_state.log_path(state_dir, req.shard_id))
                    records.append(engine_state.EngineRecord(req, pid, started, endpoint, log_file))
            engine_state.write_state(state_dir, records)

        # One write at a time, each from the shards as they are when it starts: the last one wins.
        async with self._state_lock:
            await asyncio.to_thread(write)

    async def _leave_running(self) -> None:
        """Stop watching every engine but leave it running, for the next agent to adopt."""
        await self._save_state()
        for shard in list(self._shards.values()):
            for task in (shard.task, shard.reader):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            process = shard.process
            if process is None:
                continue
            process.close()
            if process.returncode is None:
                self._left_running.append(process.pid)
                log.info(
                    "leaving an engine running for the next agent", shard=shard.req.shard_id, pid=process.pid
                )
        self._shards.clear()

    async def _watch(self, shard: _Shard) -> None:
        """Wait for ready, then for an exit; report the failure, which the control plane acts on."""
        process = shard.process
        assert process is not None
        became_ready = await self._wait_ready(shard, process)
        stalled = ""
        if became_ready:
            ready = self._status(shard, "ready")
            ready.endpoint = shard.endpoint
            ready.pid = process.pid
            ready.detail = f"{shard.engine.name} answers on {shard.endpoint}"
            self._report(ready)
            log.info("engine ready", shard=shard.req.shard_id, endpoint=shard.endpoint)
            stalled = await self._until_exit_or_stall(shard, process)
        timed_out = not became_ready and process.returncode is None
        # Also for an engine that exited by itself: the workers it forked go with it.
        returncode = await self._terminate(shard)
        shard.process = None
        failed = self._status(shard, "failed")
        failed.pid = process.pid
        failed.last_output = list(shard.output)
        failed.detail = await self._failure_reason(shard, returncode, timed_out, became_ready)
        if became_ready and stalled:
            failed.detail = f"stalled, so its process group was killed: {stalled}"
        if became_ready:
            self.restarts[shard.req.model] += 1
        self._report(failed)
        log.warning(
            "engine failed; not restarted here, the control plane places its replica again",
            shard=shard.req.shard_id,
            detail=failed.detail,
        )

    async def _until_exit_or_stall(self, shard: _Shard, process: launcher.Process) -> str:
        """Wait for a ready engine to exit; should it stall first, report that, SIGKILL its group, say why."""
        engine = shard.engine
        prober = Prober(
            self._health_session(),
            self._probe,
            name=f"{engine.name} on {self._node}" if self._node else engine.name,
            health_url=shard.local_url + engine.health_path,
            metrics_url=shard.local_url + engine.metrics_path,
            secret=shard.req.engine_secret,
            progress=engine.progress,
        )
        reason = await stall_before_exit(process, prober)
        if reason:
            stalled = self._status(shard, "stalled")
            stalled.pid = process.pid
            stalled.detail = reason
            # Reported before the kill: the control plane takes it out of routing at once.
            self._report(stalled)
            log.warning(
                "engine stalled; killing it", shard=shard.req.shard_id, pid=process.pid, reason=reason
            )
            # SIGKILL at once, not SIGTERM first: a stopped process acts on SIGTERM only once
            # continued, and a hung one would not drain; the whole group, its workers included.
            launcher.kill_group(process.pid)
        return reason

    async def _failure_reason(self, shard: _Shard, returncode: int, timed_out: bool, served: bool) -> str:
        """Why the engine failed, in words: its exit, and the line of its output that says why."""
        engine = shard.engine
        name, health = engine.name, engine.health_path
        words = last_words(engine, list(shard.output))
        if timed_out:
            said = f"{name} did not answer {health} within {_seconds(self._ready_timeout_s)}"
            return f"{said}; its last line: {words}" if words else said
        exited = f"{name} {_exit_reason(returncode)}"
        if not served:
            taken = [line for line in shard.output if engine.says_port_taken(line)]
            # The port the engine says it could not bind: a profile's args may have chosen another.
            port = next((p for p in map(engine.port_in_line, taken) if p is not None), shard.port)
            # Also asked of the port itself: the engine's group is gone by now, so whatever still
            # listens there is another program, whatever words (or none) the engine used.
            if bool(taken) or await asyncio.to_thread(_port_taken, self._bind or self._host, shard.port):
                return f"port {port} is in use: {exited}" + (f": {words}" if words else "")
            return f"{exited}: {words}" if words else f"{exited} before answering {health}"
        words = last_words(engine, list(shard.output), only_errors=True)
        return f"{exited} after serving" + (f": {words}" if words else "")

    async def _wait_ready(self, shard: _Shard, process: launcher.Process) -> bool:
        """True once the engine answers its health path; False when it exits or the time is up."""
        url = shard.local_url + shard.engine.health_path
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
            # Not wait_for: on 3.11 it swallows a cancel that lands as the process exits, and stop()
            # then waited on a watch that carried on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self._health_interval_s, left)):
                    await process.wait()

    def _health_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # The engine is on this machine, whatever address it is advertised at: a proxy from the
            # environment must not get in the way.
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def _read_output(self, shard: _Shard, process: launcher.Process) -> None:
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
                shard.output.append(self._line(shard, line))
        if pending:
            shard.output.append(self._line(shard, pending))

    @staticmethod
    def _line(shard: _Shard, raw: bytes) -> str:
        text = raw[:_MAX_LINE_CHARS].decode(errors="replace").rstrip("\r")
        # An engine that prints its arguments (SGLang does, at start) prints the secret too; these
        # lines reach `ctl logs`, the pages and a failed shard's report.
        secret = shard.req.engine_secret
        return text.replace(secret, "[secret]") if secret else text

    async def _drain_output(self, shard: _Shard) -> None:
        """Let the reader take the last lines of an exited process, then end it."""
        reader = shard.reader
        if reader is None:
            return
        await asyncio.wait({reader}, timeout=_OUTPUT_DRAIN_S)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        # Only now: a stop() that cancels the watch during the wait above drains the same reader
        # again, where dropping it first left it (and its `tail` process) running with no owner.
        shard.reader = None

    async def _terminate(self, shard: _Shard) -> int:
        """SIGTERM the process group, SIGKILL it after the grace; the leader's return code."""
        process = shard.process
        assert process is not None
        launcher.kill_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=self._stop_grace_s)
        except TimeoutError:
            log.warning("engine ignored SIGTERM; killing it", shard=shard.req.shard_id, pid=process.pid)
        # Also when the leader exited in time: a worker it left behind would hold the port or the GPU.
        launcher.kill_group(process.pid)
        returncode = await process.wait()
        if returncode == launcher.UNKNOWN_EXIT:
            # Adopted, and perhaps still this process's own child (agent/upgrade.py): reaped here.
            reaped = launcher.reap(process.pid)
            returncode = returncode if reaped is None else reaped
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
            # Back to the control plane on every report, so a server that restarted still holds it.
            engine_secret=req.engine_secret,
        )

    def _report_spawn_failure(self, shard: _Shard, argv: list[str], error: OSError) -> None:
        status = self._status(shard, "failed")
        status.detail = f"could not start {shard.engine.name}: {argv[0]}: {error.strerror or error}"
        status.last_output = list(shard.output)
        self._report(status)

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
