"""Watching a started engine: ready once it answers its health path, then failed when it exits or stalls.

Every change is reported through the supervisor's `report`:

- starting -> ready (with the endpoint), or starting -> failed (with the last
  output lines) when the engine exits or never answers within
  `ready_timeout_s` (agent.yaml's, else the engine's own);
- ready -> failed when an engine that served exits;
- ready -> stalled -> failed when a served engine stops answering its health
  path or stops producing tokens (agent/probe.py): its process group is
  killed between the two.

A failed shard is not restarted here: the control plane stops it and places
its replica again, elsewhere at once and on this node after
`control.base_backoff_s` (doubling). An agent restarting it as well would race
that decision, on a node the model is meant to stay off for a while.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import aiohttp
import structlog

from llmgw import launcher
from llmgw.agent.failure_reasons import failure_reason
from llmgw.agent.probe import Prober, stall_before_exit, wait_ready
from llmgw.agent.shard import Shard, terminate
from llmgw.config import ProbeConfig
from llmgw.engines.base import Engine
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)


class Watcher:
    """Watches the engines of shards until they fail; holds the one health-check session they share."""

    def __init__(
        self,
        report: Callable[[pb.ShardStatus], None],
        *,
        probe: ProbeConfig,
        node: str,
        ready_timeout_s: float,
        health_interval_s: float,
        stop_grace_s: float,
    ):
        self._report = report
        # How ready engines are watched for a stall, and the node's name the reasons give.
        self._probe = probe
        self._node = node
        # 0: each engine's own (Engine.default_ready_timeout_s).
        self._ready_timeout_s = ready_timeout_s
        self._health_interval_s = health_interval_s
        self._stop_grace_s = stop_grace_s
        # Engines that crashed after serving, by model, since the agent started (the control plane
        # starts them again): what the agent's metrics page counts as restarts.
        self.restarts: collections.Counter[str] = collections.Counter()
        self._session: aiohttp.ClientSession | None = None

    async def aclose(self) -> None:
        """Release the health-check session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def ready_timeout_s(self, engine: Engine) -> float:
        """How long engine may take to answer its health path: agent.yaml's, else the engine's own."""
        return self._ready_timeout_s or engine.default_ready_timeout_s

    async def watch(self, shard: Shard, bind: str) -> None:
        """Wait for ready, then for an exit; report the failure, which the control plane acts on."""
        process = shard.process
        assert process is not None
        ready_timeout_s = self.ready_timeout_s(shard.engine)
        became_ready = await wait_ready(
            self._health_session(),
            shard.local_url + shard.engine.health_path,
            process,
            timeout_s=ready_timeout_s,
            interval_s=self._health_interval_s,
        )
        stalled = ""
        if became_ready:
            ready = shard.status_as("ready")
            ready.endpoint = shard.endpoint
            ready.pid = process.pid
            ready.detail = f"{shard.engine.name} answers on {shard.endpoint}"
            self._report(ready)
            log.info("engine ready", shard=shard.req.shard_id, endpoint=shard.endpoint)
            stalled = await self._until_exit_or_stall(shard, process)
        timed_out = not became_ready and process.returncode is None
        # Also for an engine that exited by itself: the workers it forked go with it.
        returncode = await terminate(shard, self._stop_grace_s)
        shard.process = None
        failed = shard.status_as("failed")
        failed.pid = process.pid
        failed.last_output = list(shard.output)
        failed.detail = await failure_reason(
            shard,
            returncode,
            timed_out=timed_out,
            served=became_ready,
            ready_timeout_s=ready_timeout_s,
            bind=bind,
        )
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

    async def _until_exit_or_stall(self, shard: Shard, process: launcher.Process) -> str:
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
            stalled = shard.status_as("stalled")
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

    def _health_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # The engine is on this machine, whatever address it is advertised at: a proxy from the
            # environment must not get in the way.
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session
