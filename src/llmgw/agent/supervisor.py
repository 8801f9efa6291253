"""The supervisor: starts engine processes, watches them, stops them; what the agent asks of its engines.

Each shard is one engine process (agent/shard.py), started by llmgw's
launcher in its own session, on a free port of agent.yaml's `engine_ports`
(agent/ports.py), listening on `engine_bind` and advertised at the node's
address (the one the control plane reaches it at: agent/client.py tells the
supervisor once connected), and requiring the replica's secret of its
callers. Its output, stdout and stderr merged, goes to a log file under
`state_dir` (agent/state.py: that is what lets an engine outlive the agent and
be adopted by the next one); the supervisor follows the file and keeps its
last lines (agent/engine_output.py). agent/watch.py watches it until it is
ready and then until it fails, and every change of state is reported through
`on_status`: starting, downloading, ready, stalled, failed (agent/watch.py
says when), and stopped, once `stop` has ended the whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import structlog

from llmgw import launcher
from llmgw.addresses import DEFAULT_ENGINE_PORTS, parse_port_range, url_host
from llmgw.agent import engine_output
from llmgw.agent import state as engine_state
from llmgw.agent.failure_reasons import exit_reason
from llmgw.agent.metrics import MetricsTarget
from llmgw.agent.ports import NoFreePort, free_port, on_this_machine
from llmgw.agent.shard import Shard, status_for, terminate
from llmgw.agent.watch import Watcher
from llmgw.agent.weights import WeightsCache, WeightsError
from llmgw.config import ProbeConfig
from llmgw.engines.base import Engine
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

_DEFAULT_PORTS = parse_port_range(DEFAULT_ENGINE_PORTS)
_DEFAULT_PROBE = ProbeConfig()


class Supervisor:
    """Starts, watches and stops engine processes; usable as `async with`."""

    def __init__(
        self,
        engines: Mapping[str, Engine],
        on_status: Callable[[pb.ShardStatus], None] | None = None,
        ready_timeout_s: float = 0.0,
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
        self._stop_grace_s = stop_grace_s
        self._watcher = Watcher(
            self._report,
            probe=probe,
            node=node,
            ready_timeout_s=ready_timeout_s,
            health_interval_s=health_interval_s,
            stop_grace_s=stop_grace_s,
        )
        # The address engines are advertised at (their endpoints' host), until advertise() says
        # otherwise; bind is where they listen, the advertised address when empty.
        self._host = host
        self._bind = bind
        self._ports = ports
        self._shards: dict[str, Shard] = {}
        # Shards stop() has taken from _shards and is still ending: a forced exit in that window
        # (a second signal during a drain) must kill them too, or an engine outlived its agent.
        self._stopping: dict[str, Shard] = {}
        # The last output lines of the shards that ended here.
        self._ended = engine_output.Ended()
        # Engines that crashed after serving, by model: what the agent's metrics page counts as restarts.
        self.restarts = self._watcher.restarts
        # The process groups a clean stop left running for the next agent: a second signal that
        # comes while the rest of llmgw still drains must still find them to kill.
        self._left_running: list[int] = []
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
            status = status_for(req, req.engine, "failed")
            status.detail = f"this node has no engine called {req.engine!r} (it has: {known})"
            self._report(status)
            return
        shard = Shard(req, engine)
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
            await terminate(shard, self._stop_grace_s)
            self._report(shard.status_as("stopped"))
            return
        shard.task = asyncio.create_task(
            self._watcher.watch(shard, self._bind or self._host), name=f"supervise {req.shard_id}"
        )

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

    async def _end(self, shard_id: str, shard: Shard) -> None:
        if shard.task is not None:
            shard.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shard.task
        detail = "stopped"
        if shard.process is not None:
            returncode = await terminate(shard, self._stop_grace_s)
            detail = f"stopped ({shard.engine.name} {exit_reason(returncode)})"
        self._ended.keep(shard_id, list(shard.output))
        status = shard.status_as("stopped")
        status.detail = detail
        self._report(status)

    async def aclose(self) -> None:
        """Stop every shard, in parallel, and release the health-check session."""
        self._closed = True
        if self._keep_on_close:
            await self._leave_running()
        else:
            await asyncio.gather(*(self.stop(shard_id) for shard_id in list(self._shards)))
        await self._watcher.aclose()

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
        return self._ended.lines(shard_id)

    def sources(self) -> list[str]:
        """The shards whose output can be read: those running, then those that ended lately."""
        return [*self._shards, *(s for s in self._ended.shard_ids() if s not in self._shards)]

    # --- one shard's life -----------------------------------------------------------------

    async def _spawn(self, shard: Shard) -> bool:
        """Start shard's process and report starting; on failure report failed and say False."""
        req = shard.req
        bind = self._bind or self._host
        taken = {other.port for other in self._shards.values() if other is not shard}
        try:
            port = await asyncio.to_thread(free_port, bind, self._ports, taken)
        except NoFreePort as exc:
            status = shard.status_as("failed")
            status.detail = str(exc)
            self._report(status)
            return False
        shard.port = port
        spec = shard.launch_spec(
            port,
            bind,
            parallel=self._parallel(req.engine) if self._parallel is not None else 0,
            binary=self._binaries(req.engine) if self._binaries is not None else "",
        )
        try:
            argv = shard.engine.command(spec)
        except LlmgwError as e:
            # The adapter refusing this replica (no model file, say) fails the one shard,
            # not the agent's stream that delivered it.
            status = shard.status_as("failed")
            status.detail = str(e)
            self._report(status)
            return False
        path = engine_state.log_path(self._state_dir, req.shard_id)
        try:
            process = await engine_state.start_engine(argv, shard.engine.environment(spec), path)
        except OSError as e:
            self._report_spawn_failure(shard, argv, e)
            return False
        shard.process = process
        shard.reader = asyncio.create_task(
            engine_output.follow(shard.output, req.engine_secret, path, process.pid),
            name=f"output {req.shard_id}",
        )
        shard.endpoint = f"http://{url_host(self._host)}:{port}"
        shard.local_url = f"http://{url_host(on_this_machine(bind))}:{port}"
        status = shard.status_as("starting")
        status.pid = process.pid
        status.detail = f"starting {shard.engine.name} (pid {process.pid}) on port {port}"
        self._report(status)
        log.info(
            "engine starting",
            shard=req.shard_id,
            engine=shard.engine.name,
            pid=process.pid,
            argv=engine_output.redacted(argv, req.engine_secret),
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
            shard = Shard(req, engine)
            shard.process = launcher.adopt(record.pid)
            shard.endpoint = shard.local_url = record.endpoint
            source_path = self._weights.path_of(req.source, req.sha256) if self._weights is not None else None
            shard.model_path = str(source_path) if source_path is not None else ""
            self._shards[req.shard_id] = shard
            shard.reader = asyncio.create_task(
                engine_output.follow(shard.output, req.engine_secret, Path(record.log), record.pid),
                name=f"output {req.shard_id}",
            )
            status = shard.status_as("starting")
            status.pid = record.pid
            status.detail = (
                f"adopted {engine.name} (pid {record.pid}) from the previous agent; "
                f"checking that it answers on {record.endpoint}"
            )
            self._report(status)
            log.info("adopted an engine the previous agent left running", shard=req.shard_id, pid=record.pid)
            shard.task = asyncio.create_task(
                self._watcher.watch(shard, self._bind or self._host), name=f"supervise {req.shard_id}"
            )
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

    async def _fetch_and_run(self, shard: Shard) -> None:
        """Fetch the shard's weights (reporting progress as state downloading), then start and watch it."""
        req = shard.req
        assert self._weights is not None

        def progress(text: str) -> None:
            status = shard.status_as("downloading")
            status.detail = text
            self._report(status)

        progress(f"fetching {req.source}")
        try:
            path = await self._weights.fetch(req.source, req.sha256, progress)
        except (WeightsError, OSError) as exc:
            failed = shard.status_as("failed")
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
            failed = shard.status_as("failed")
            failed.detail = str(exc)
            self._report(failed)
            return
        shard.model_path = str(path)
        if not await self._spawn(shard):
            return
        await self._watcher.watch(shard, self._bind or self._host)

    async def _save_state(self) -> None:
        """Rewrite the state file with every engine process alive now."""
        alive = [
            (shard.req, shard.process.pid, shard.endpoint)
            for shard in self._shards.values()
            if shard.process is not None and shard.process.returncode is None
        ]
        # One write at a time, each from the shards as they are when it starts: the last one wins.
        async with self._state_lock:
            await asyncio.to_thread(engine_state.record_engines, self._state_dir, alive)

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

    # --- reporting ------------------------------------------------------------------------

    def _report_spawn_failure(self, shard: Shard, argv: list[str], error: OSError) -> None:
        status = shard.status_as("failed")
        status.detail = f"could not start {shard.engine.name}: {argv[0]}: {error.strerror or error}"
        status.last_output = list(shard.output)
        self._report(status)

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
