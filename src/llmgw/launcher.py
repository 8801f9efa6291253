"""The one way llmgw starts a process: in its own session, watched through a pidfd.

Engines, the installer's commands (apt-get, ldd, an engine's `--version`) and
`llmgw ctl engine-check` all start here, so they all get the same guarantees:

- Each child leads its own session, so its whole process group can be
  signalled (`kill_group`): engines fork workers and apt-get forks dpkg, and a
  worker left behind holds the GPU, the port or the dpkg lock.
- Its stdin is /dev/null; its output goes to a file the caller opened (an
  engine's log, which outlives the agent) or to a pipe read through
  `Process.stdout`.
- Its exit is noticed through a pidfd, not asyncio's child watcher. asyncio's
  subprocess transport kills a child still running when it is closed or
  collected, and an engine left for the next agent must survive exactly that;
  subprocess.Popen complains when collected with its child still running,
  which for an engine is the point. The same `Process` watches an engine
  adopted from the previous agent (`adopt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import attrs

# Where a child's output goes, besides a file descriptor: as in the subprocess module.
PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL

# The exit status of a process that is not this one's child: the kernel tells only its parent.
UNKNOWN_EXIT = 1 << 16

# How much of a command's output `run` keeps: enough for the last lines of an apt-get
# failure, not an unbounded buffer of a chatty engine.
KEEP_BYTES = 256 * 1024
# How long `run` reads on after killing a command that ran out of time: a grandchild that
# left the group can hold the pipe open for ever.
_DRAIN_S = 5.0


@attrs.frozen
class CommandResult:
    """How a command ended: its exit status and its output, stdout and stderr together."""

    returncode: int
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def last_line(self) -> str:
        lines = [line.strip() for line in self.output.strip().splitlines() if line.strip()]
        return lines[-1] if lines else ""


class Process:
    """A process watched through a pidfd: one started here (child) or one adopted.

    The exit status of an adopted one is unknown (UNKNOWN_EXIT): the kernel tells only its parent.
    """

    def __init__(
        self,
        pid: int,
        *,
        child: bool = False,
        stdout: asyncio.StreamReader | None = None,
        transport: asyncio.ReadTransport | None = None,
    ) -> None:
        self._pid = pid
        self._child = child
        # The read end of the child's output pipe, when it has one.
        self.stdout = stdout
        self._transport = transport
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
        """Stop watching, and close the output pipe: the agent stops, or is done with the output."""
        self._unwatch()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def _unwatch(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _on_exit(self) -> None:
        # A pidfd becomes readable when its process exits.
        self._unwatch()
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


def reap(pid: int) -> int | None:
    """pid's exit status when it is this process's child and has ended; None when it is not, or runs on.

    An engine adopted after an upgrade's exec is still this process's child (the same pid
    started it): unreaped, it would stay a zombie, and the next agent would adopt that.
    """
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if reaped else None


def adopt(pid: int) -> Process:
    """Watch a process this one did not start (an engine the previous agent left running)."""
    return Process(pid)


async def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdout: int = PIPE,
    stderr: int = STDOUT,
) -> Process:
    """Start argv in its own session; env is added to this process's own environment.

    stdout is a file descriptor (it stays the caller's to close) or PIPE, read through the
    returned Process's stdout; stderr is STDOUT (with the output), DEVNULL or a descriptor.
    Raises OSError when argv cannot be started (FileNotFoundError for a program that is not there).
    """
    loop = asyncio.get_running_loop()
    full_env = {**os.environ, **env} if env else dict(os.environ)
    read_end, out = os.pipe() if stdout == PIPE else (None, stdout)
    actions: list[tuple[int, int, str, int, int] | tuple[int, int, int]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out, 1),
    ]
    if stderr == DEVNULL:
        actions.append((os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0))
    else:
        actions.append((os.POSIX_SPAWN_DUP2, out if stderr == STDOUT else stderr, 2))

    def _spawn() -> int:
        return os.posix_spawnp(argv[0], list(argv), full_env, file_actions=actions, setsid=True)

    try:
        # In a thread, as the old asyncio spawn was: a large agent's fork is not free.
        spawning = asyncio.ensure_future(asyncio.to_thread(_spawn))
        try:
            pid = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            # The thread starts it anyway; a cancelled start must not leave it running unowned.
            with contextlib.suppress(Exception):
                orphan = Process(await spawning, child=True)
                kill_group(orphan.pid)
                await orphan.wait()
            raise
    except BaseException:
        if read_end is not None:
            os.close(read_end)
        raise
    finally:
        if read_end is not None:
            # The child has its own copy; the parent keeping this one would mean no end of output.
            os.close(out)
    if read_end is None:
        return Process(pid, child=True)
    reader = asyncio.StreamReader(loop=loop)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(read_end, "rb", buffering=0)
    )
    return Process(pid, child=True, stdout=reader, transport=transport)


def kill_group(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal the process group that pid leads; nothing when it is gone.

    The group id is the leader's pid (each child leads its own session); the kernel keeps
    that id from being reused while any member lives, so signalling it after the leader
    is gone is still safe.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    keep_bytes: int = KEEP_BYTES,
) -> CommandResult:
    """Run argv to its end, keeping the last keep_bytes of its output, stdout and stderr together.

    Past timeout_s, or when the caller is cancelled, its whole group is killed. Raises OSError
    when argv cannot be started.
    """
    process = await start(argv, env=env)
    output = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            await _pump(process, output, keep_bytes)
            returncode = await process.wait()
    except TimeoutError:
        kill_group(process.pid)
        # What it printed before it was killed is often the reason it hung.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_S):
                await _pump(process, output, keep_bytes)
        await process.wait()
        return CommandResult(-1, _decode(output, keep_bytes), timed_out=True)
    except BaseException:
        kill_group(process.pid)
        with contextlib.suppress(Exception):
            await asyncio.shield(process.wait())
        raise
    finally:
        process.close()
    return CommandResult(returncode, _decode(output, keep_bytes))


async def _pump(process: Process, into: bytearray, keep_bytes: int) -> None:
    assert process.stdout is not None
    while chunk := await process.stdout.read(65536):
        into += chunk
        # Only the tail matters; a command that prints without end must not fill memory.
        if len(into) > 2 * keep_bytes:
            del into[:-keep_bytes]


def _decode(output: bytearray, keep_bytes: int) -> str:
    return bytes(output[-keep_bytes:]).decode("utf-8", errors="replace")
