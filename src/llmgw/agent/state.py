"""What lets engines outlive their agent: the state file, the engines' log files, adopted processes.

An agent that stops (an upgrade, a restart by systemd, a crash) must not take
a serving 70B model down with it: loading one again takes minutes of an
outage nobody asked for. So each engine runs in its own session, writes its
output to a file rather than to a pipe the agent holds (a pipe whose reader
is gone kills the writer with SIGPIPE at its next line), and the agent keeps
`<state_dir>/shards.json` current with every engine it runs: the request it
was started for, its pid and the pid's start time, its endpoint. The request
holds the replica's secret, so the file is the agent's user's alone (0600).

The next agent reads that file and adopts every engine whose pid is still the
same process (the start time tells a reused pid apart); it then reports them
as running in its Register, and the control plane adopts them in turn instead
of starting duplicates.

Engines are started by llmgw's launcher (launcher.py), whose Process also
watches an adopted engine; that one is not the new agent's child, so its exit
status cannot be known.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from pathlib import Path

import attrs
import structlog

from llmgw import durable, launcher, strictjson
from llmgw.names import file_name
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

STATE_FILE = "shards.json"
LOG_DIR = "shards"
# The last lines of a log a new reader starts from: what the supervisor keeps of any engine.
_TAIL_LINES = 500


@attrs.frozen
class EngineRecord:
    """One engine as the state file keeps it."""

    request: pb.StartShard
    pid: int
    # The process's start time in clock ticks since boot (/proc/PID/stat field 22).
    started: int
    endpoint: str
    log: str


def log_path(state_dir: Path, shard_id: str) -> Path:
    """Where the engine of shard_id writes; always a file directly in state_dir's log directory.

    Encoded: the id comes from the control plane and holds the model's name, and a name such as
    ../../x once put the log outside state_dir (or org/model into a folder that did not exist).
    """
    return state_dir / LOG_DIR / f"{file_name(shard_id)}.log"


def process_start_time(pid: int) -> int | None:
    """The start time of pid in clock ticks since boot, or None when there is no such process; blocking."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after its last ")" are plain.
    fields = stat.rpartition(")")[2].split()
    try:
        # Field 22 overall is the 20th after the name (which is field 2; field 3 is the first here).
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def write_state(state_dir: Path, records: list[EngineRecord]) -> None:
    """Replace the state file with records; blocking."""
    state_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "shards": [
            {
                "request": base64.b64encode(bytes(r.request)).decode(),
                "pid": r.pid,
                "started": r.started,
                "endpoint": r.endpoint,
                "log": r.log,
            }
            for r in records
        ]
    }
    # Only the agent's user may read it: each request carries its replica's secret. Whole and on disk:
    # a power loss must not leave the next agent an empty file and engines it cannot adopt.
    durable.write_atomically(state_dir / STATE_FILE, strictjson.dumps(data, indent=1), 0o600)


def record_engines(state_dir: Path, alive: list[tuple[pb.StartShard, int, str]]) -> None:
    """Replace the state file with the engines alive, each as (request, pid, endpoint); blocking."""
    records = []
    for req, pid, endpoint in alive:
        started = process_start_time(pid)
        if started is not None:
            records.append(EngineRecord(req, pid, started, endpoint, str(log_path(state_dir, req.shard_id))))
    write_state(state_dir, records)


def read_state(state_dir: Path) -> list[EngineRecord]:
    """The engines the previous agent ran, whether or not they still do; blocking."""
    path = state_dir / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [
            EngineRecord(
                request=pb.StartShard().parse(base64.b64decode(entry["request"])),
                pid=int(entry["pid"]),
                started=int(entry["started"]),
                endpoint=str(entry["endpoint"]),
                log=str(entry["log"]),
            )
            for entry in data["shards"]
        ]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # A file nobody can read must not stop the agent; the engines it named run on unadopted,
        # and the log says which file to look at.
        log.warning(
            "the engine state file cannot be read; no engine is adopted", path=str(path), error=str(exc)
        )
        return []


def still_running(record: EngineRecord) -> bool:
    """Whether the record's pid is still the process it names (and not a later one given the same pid)."""
    return process_start_time(record.pid) == record.started


async def start_engine(argv: list[str], env: dict[str, str], path: Path) -> launcher.Process:
    """Start an engine with its output, stdout and stderr merged, going to a fresh log file at path.

    A file, not a pipe the agent holds: a pipe whose reader is gone (the agent restarting) kills
    the engine with SIGPIPE at its next line.
    """

    def _open() -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND, so the file can be cut short under a running engine without a hole at its start.
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)

    log_fd = await asyncio.to_thread(_open)
    try:
        return await launcher.start(argv, env=env, stdout=log_fd)
    finally:
        os.close(log_fd)


async def follow_log(path: Path, pid: int) -> launcher.Process:
    """A `tail` of the log that ends once the engine pid is gone; read its stdout like a pipe.

    tail(1) rather than a loop here: it already follows a file across truncation,
    reads without blocking the agent's loop, and stops by itself with the engine.
    Its own complaints (a file replaced, truncated) are not the engine's output.
    """
    argv = ["tail", "-n", str(_TAIL_LINES), "-s", "0.2", "-F", f"--pid={pid}", str(path)]
    return await launcher.start(argv, stderr=launcher.DEVNULL)


async def end_follower(process: launcher.Process) -> None:
    if process.returncode is None:
        launcher.kill_group(process.pid, signal.SIGTERM)
    await process.wait()
    process.close()
