"""The one way llmgw starts a process: its own session, output to a file or a pipe, exit seen by pidfd."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from llmgw import launcher

WAIT_S = 30.0


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _until(check: Callable[[], object]) -> None:
    """Poll check until it holds: for another process's state, which no event announces."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


async def _read_pidfile(path: Path) -> int:
    await _until(lambda: path.exists() and path.read_text().strip())
    return int((await asyncio.to_thread(path.read_text)).strip())


class TestStart:
    async def test_a_child_leads_its_own_session_with_nothing_on_its_stdin(self) -> None:
        process = await launcher.start(["sh", "-c", "cat; echo done"])
        assert process.stdout is not None
        assert await process.stdout.read() == b"done\n"
        assert await process.wait() == 0
        # Its own session, so its whole group can be signalled without touching this one.
        started = await launcher.start(["sleep", "30"])
        try:
            assert os.getsid(started.pid) == started.pid != os.getsid(0)
        finally:
            launcher.kill_group(started.pid)
            assert await started.wait() == -signal.SIGKILL
            started.close()
        process.close()

    async def test_output_and_errors_go_to_the_file_given(self, tmp_path: Path) -> None:
        path = tmp_path / "out.log"
        fd = await asyncio.to_thread(os.open, path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            process = await launcher.start(["sh", "-c", "echo out; echo err >&2; exit 3"], stdout=fd)
        finally:
            os.close(fd)
        assert process.stdout is None
        assert await process.wait() == 3
        assert (await asyncio.to_thread(path.read_text)).split() == ["out", "err"]

    async def test_errors_can_be_dropped_from_a_piped_output(self) -> None:
        process = await launcher.start(["sh", "-c", "echo out; echo err >&2"], stderr=launcher.DEVNULL)
        assert process.stdout is not None
        assert await process.stdout.read() == b"out\n"
        await process.wait()
        process.close()

    async def test_the_environment_given_is_added_to_this_ones(self) -> None:
        result = await launcher.run(["sh", "-c", 'echo "$LLMGW_TEST:${PATH:+path}"'], env={"LLMGW_TEST": "x"})
        assert result.output == "x:path\n"

    async def test_a_program_that_is_not_there_is_an_oserror(self) -> None:
        with pytest.raises(FileNotFoundError):
            await launcher.start(["/nonexistent/llama-server"])

    async def test_a_child_outlives_its_process_object(self, tmp_path: Path) -> None:
        """What lets an engine outlive its agent: closing or dropping the watcher leaves it running."""
        process = await launcher.start(["sleep", "30"])
        pid = process.pid
        process.close()
        del process
        gc.collect()
        try:
            assert not _gone(pid)
        finally:
            launcher.kill_group(pid)
            adopted = launcher.adopt(pid)
            await adopted.wait()
            # Reaped by nobody here: a zombie until this test's process waits for it.
            await asyncio.to_thread(os.waitpid, pid, 0)

    async def test_an_adopted_process_ends_with_an_unknown_status(self) -> None:
        """Only its parent hears how a process ended; an adopting agent is not that."""
        child = await launcher.start(["sleep", "30"])
        adopted = launcher.adopt(child.pid)
        launcher.kill_group(child.pid)
        assert await child.wait() == -signal.SIGKILL
        assert await adopted.wait() == launcher.UNKNOWN_EXIT
        child.close()

    async def test_an_adopted_process_that_is_still_this_ones_child_is_reaped_with_its_status(self) -> None:
        """After an upgrade's exec the engines are the same pid's children: none is left a zombie."""
        pid = await asyncio.to_thread(os.posix_spawnp, "sh", ["sh", "-c", "exit 3"], dict(os.environ))
        adopted = launcher.adopt(pid)
        assert await adopted.wait() == launcher.UNKNOWN_EXIT
        assert launcher.reap(pid) == 3
        # Not this process's child: nothing to reap, nothing known.
        assert launcher.reap(1) is None


class TestKillGroup:
    async def test_killing_the_group_takes_what_the_child_started_too(self, tmp_path: Path) -> None:
        pidfile = tmp_path / "grandchild"
        process = await launcher.start(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"])
        grandchild = await _read_pidfile(pidfile)
        launcher.kill_group(process.pid)
        await process.wait()
        await _until(lambda: _gone(grandchild))
        process.close()

    async def test_a_group_that_is_gone_is_no_error(self) -> None:
        process = await launcher.start(["true"])
        await process.wait()
        process.close()
        launcher.kill_group(process.pid)


class TestRun:
    async def test_a_cancelled_run_kills_what_it_started(self, tmp_path: Path) -> None:
        pidfile = tmp_path / "grandchild"
        running = asyncio.create_task(launcher.run(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"]))
        grandchild = await _read_pidfile(pidfile)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await _until(lambda: _gone(grandchild))

    async def test_only_the_last_bytes_of_a_long_output_are_kept(self) -> None:
        result = await launcher.run(["sh", "-c", "seq 1 100000"], keep_bytes=20)
        assert result.ok
        assert result.output.endswith("99999\n100000\n") and len(result.output) == 20
