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

An adopted engine is not the new agent's child, so its exit is noticed through
a pidfd and its exit status cannot be known.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Protocol

import attrs
import structlog

from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

STATE_FILE = "shards.json"
LOG_DIR = "shards"
# The exit status of an engine that was not this agent's child: the kernel tells only its parent.
UNKNOWN_EXIT = 1 << 16
# The last lines of a log a new reader starts from: what the supervisor keeps of any engine.
_TAIL_LINES = 500


class EngineProcess(Protocol):
    """What the supervisor needs of an engine process: asyncio's Process, or an adopted one."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


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
    return state_dir / LOG_DIR / f"{shard_id}.log"


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
    tmp = state_dir / (STATE_FILE + ".tmp")
    # Only the agent's user may read it: each request carries its replica's secret.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        # Also for a .tmp an older agent left readable: O_CREAT keeps an existing file's mode.
        os.fchmod(out.fileno(), 0o600)
        out.write(json.dumps(data, indent=1))
    # Renamed into place: an agent killed mid-write leaves the previous file, never half of one.
    os.replace(tmp, state_dir / STATE_FILE)


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


async def open_log(path: Path) -> int:
    """A fresh log file for an engine's output, as a descriptor to hand to the process."""

    def _open() -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND, so the file can be cut short under a running engine without a hole at its start.
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o640)

    return await asyncio.to_thread(_open)


async def follow_log(path: Path, pid: int) -> asyncio.subprocess.Process:
    """A `tail` of the log that ends once the engine pid is gone; read its stdout like the engine's own.

    tail(1) rather than a loop here: it already follows a file across truncation,
    reads without blocking the agent's loop, and stops by itself with the engine.
    """
    return await asyncio.create_subprocess_exec(
        "tail",
        "-n",
        str(_TAIL_LINES),
        "-s",
        "0.2",
        "-F",
        f"--pid={pid}",
        str(path),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def end_follower(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    await process.wait()


async def spawn_detached(argv: list[str], env: dict[str, str], log_fd: int) -> PidProcess:
    """Start an engine in its own session with its output on log_fd, watched through a pidfd.

    Not asyncio's subprocess: its transport kills a child still running when it
    is closed or collected, and an engine left for the next agent must survive
    exactly that. Nor subprocess.Popen, which complains when collected with its
    child still running: here that is the point.
    """

    def _start() -> int:
        return os.posix_spawnp(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )

    pid = await asyncio.to_thread(_start)
    return PidProcess(pid, child=True)


class PidProcess:
    """A process watched through a pidfd: one this agent started (child) or one it adopted.

    The exit status of an adopted one is unknown (UNKNOWN_EXIT): the kernel tells only its parent.
    """

    def __init__(self, pid: int, *, child: bool = False) -> None:
        self._pid = pid
        self._child = child
        self._returncode: int | None = None
        self._exited = asyncio.get_running_loop().create_future()
        self._fd: int | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._set_exited()
            return
        asyncio.get_running_loop().add_reader(self._fd, self._on_exit)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        assert self._returncode is not None
        return self._returncode

    def close(self) -> None:
        """Stop watching (the agent stops; the engine runs on)."""
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _on_exit(self) -> None:
        # A pidfd becomes readable when its process exits.
        self.close()
        self._set_exited()

    def _set_exited(self) -> None:
        code = UNKNOWN_EXIT
        if self._child:
            # Reaped here, at once (WNOHANG never waits): the pidfd said it has exited.
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(self._pid, os.WNOHANG)
                code = os.waitstatus_to_exitcode(status)
        self._returncode = code
        if not self._exited.done():
            self._exited.set_result(None)
