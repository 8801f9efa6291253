"""An engine's output as the agent keeps it: its last lines, secret blotted out, and those of ended shards.

An engine writes to a log file under `state_dir` (agent/state.py); the agent
follows the file and keeps a ring of its last OUTPUT_LINES lines, which reach
`llmgw ctl logs`, the pages and a failed shard's report.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from pathlib import Path

from llmgw import launcher
from llmgw.agent import state as engine_state

OUTPUT_LINES = 500
# A line longer than this is cut: an engine dumping a tensor must not eat the agent's memory.
_MAX_LINE_CHARS = 4000
# How long to wait for the last output after the process exits; a grandchild that kept
# the pipe open must not hold up the failure report.
_OUTPUT_DRAIN_S = 1.0
# The output of shards that ended, kept for `llmgw ctl logs NODE --source SHARD`: the output of a
# failed engine is what explains it, and the control plane stops a failed shard at once.
ENDED_KEPT = 16


def redacted(lines: list[str], secret: str) -> list[str]:
    """lines with the replica's secret blotted out, for a log or a page."""
    if not secret:
        return lines
    return [line.replace(secret, "[secret]") for line in lines]


async def follow(output: deque[str], secret: str, path: Path, pid: int) -> None:
    """Keep the output lines of an engine that writes to a file."""
    tail = await engine_state.follow_log(path, pid)
    try:
        await _read_output(output, secret, tail)
    finally:
        await engine_state.end_follower(tail)


async def _read_output(output: deque[str], secret: str, process: launcher.Process) -> None:
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
            output.append(_line(line, secret))
    if pending:
        output.append(_line(pending, secret))


def _line(raw: bytes, secret: str) -> str:
    text = raw[:_MAX_LINE_CHARS].decode(errors="replace").rstrip("\r")
    # An engine that prints its arguments (SGLang does, at start) prints the secret too; these
    # lines reach `ctl logs`, the pages and a failed shard's report.
    return text.replace(secret, "[secret]") if secret else text


async def drain(reader: asyncio.Task[None]) -> None:
    """Let the reader take the last lines of an exited process, then end it."""
    await asyncio.wait({reader}, timeout=_OUTPUT_DRAIN_S)
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader


class Ended:
    """The last output lines of the shards that ended here, the newest ENDED_KEPT."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}

    def keep(self, shard_id: str, lines: list[str]) -> None:
        if not lines:
            return
        self._lines.pop(shard_id, None)
        self._lines[shard_id] = lines
        while len(self._lines) > ENDED_KEPT:
            del self._lines[next(iter(self._lines))]

    def lines(self, shard_id: str) -> list[str]:
        """The shard's kept lines, oldest first; empty for a shard not kept."""
        return list(self._lines.get(shard_id, ()))

    def shard_ids(self) -> list[str]:
        """The shards kept, oldest first."""
        return list(self._lines)
