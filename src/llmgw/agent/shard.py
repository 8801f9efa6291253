"""One shard as the supervisor holds it: its request, engine process, output and last status; and its ending.

A shard is one engine process, in its own session so that its process group
can be signalled as a whole: engines fork workers, and a worker left behind
holds the GPU.
"""

from __future__ import annotations

import asyncio
import signal
from collections import deque

import structlog

from llmgw import launcher
from llmgw.agent import engine_output
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)


class Shard:
    """One shard's request, process, output and last reported status."""

    def __init__(self, req: pb.StartShard, engine: Engine):
        self.req = req
        self.engine = engine
        self.output: deque[str] = deque(maxlen=engine_output.OUTPUT_LINES)
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

    def launch_spec(self, port: int, host: str, *, parallel: int, binary: str) -> LaunchSpec:
        """What the engine is started with; parallel is agent.yaml's, for a request that sets none."""
        req = self.req
        return LaunchSpec(
            model=req.model,
            port=port,
            host=host,
            args=tuple(req.args),
            env=tuple(req.env.items()),
            gpu_indices=tuple(req.gpu_indices),
            context_size=req.context_size,
            parallel=req.parallel or parallel,
            rank=req.rank,
            world_size=req.world_size or 1,
            master_addr=req.master_addr,
            master_port=req.master_port,
            model_path=self.model_path,
            binary=binary,
            secret=req.engine_secret,
        )

    def status_as(self, state: str) -> pb.ShardStatus:
        """A fresh status of this shard in state."""
        return status_for(self.req, self.engine.name, state)


def status_for(req: pb.StartShard, engine: str, state: str) -> pb.ShardStatus:
    """A fresh status of req's shard, run by engine, in state."""
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


async def terminate(shard: Shard, grace_s: float) -> int:
    """SIGTERM the process group, SIGKILL it after the grace; the leader's return code."""
    process = shard.process
    assert process is not None
    launcher.kill_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=grace_s)
    except TimeoutError:
        log.warning("engine ignored SIGTERM; killing it", shard=shard.req.shard_id, pid=process.pid)
    # Also when the leader exited in time: a worker it left behind would hold the port or the GPU.
    launcher.kill_group(process.pid)
    returncode = await process.wait()
    if returncode == launcher.UNKNOWN_EXIT:
        # Adopted, and perhaps still this process's own child (agent/upgrade.py): reaped here.
        reaped = launcher.reap(process.pid)
        returncode = returncode if reaped is None else reaped
    await _drain_output(shard)
    return returncode


async def _drain_output(shard: Shard) -> None:
    """Let the reader take the last lines of an exited process, then end it."""
    reader = shard.reader
    if reader is None:
        return
    await engine_output.drain(reader)
    # Only now: a stop() that cancels the watch during the drain drains the same reader again,
    # where dropping it first left it (and its `tail` process) running with no owner.
    shard.reader = None
