"""Why an engine ended, in an operator's words: its exit, and the line of its output that says why."""

from __future__ import annotations

import asyncio
import signal

from llmgw import launcher
from llmgw.agent.ports import port_taken
from llmgw.agent.shard import Shard
from llmgw.engines.base import last_words


def exit_reason(returncode: int) -> str:
    """How the process ended: "exited with code 1", "was killed by SIGKILL"."""
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


async def failure_reason(
    shard: Shard, returncode: int, *, timed_out: bool, served: bool, ready_timeout_s: float, bind: str
) -> str:
    """Why the engine failed, in words: its exit, and the line of its output that says why."""
    engine = shard.engine
    name, health = engine.name, engine.health_path
    words = last_words(engine, list(shard.output))
    if timed_out:
        said = f"{name} did not answer {health} within {_seconds(ready_timeout_s)}"
        return f"{said}; its last line: {words}" if words else said
    exited = f"{name} {exit_reason(returncode)}"
    if not served:
        taken = [line for line in shard.output if engine.says_port_taken(line)]
        # The port the engine says it could not bind: a profile's args may have chosen another.
        port = next((p for p in map(engine.port_in_line, taken) if p is not None), shard.port)
        # Also asked of the port itself: the engine's group is gone by now, so whatever still
        # listens there is another program, whatever words (or none) the engine used.
        if bool(taken) or await asyncio.to_thread(port_taken, bind, shard.port):
            return f"port {port} is in use: {exited}" + (f": {words}" if words else "")
        return f"{exited}: {words}" if words else f"{exited} before answering {health}"
    words = last_words(engine, list(shard.output), only_errors=True)
    return f"{exited} after serving" + (f": {words}" if words else "")
