"""The real command runner: asyncio subprocesses, never blocking the loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from llmgw.agent.provision.runner import SubprocessRunner


async def test_a_command_reports_its_status_and_both_output_streams() -> None:
    res = await SubprocessRunner().run(["sh", "-c", "echo out; echo err >&2; exit 3"])

    assert (res.returncode, res.ok, res.timed_out) == (3, False, False)
    assert res.output.split() == ["out", "err"]
    assert res.last_line() == "err"


async def test_the_environment_given_is_added_to_the_agents_own() -> None:
    res = await SubprocessRunner().run(
        ["sh", "-c", 'echo "$DEBIAN_FRONTEND:${PATH:+path}"'], env={"DEBIAN_FRONTEND": "noninteractive"}
    )

    assert res.output.strip() == "noninteractive:path"


async def test_a_program_that_does_not_exist_fails_like_in_a_shell() -> None:
    res = await SubprocessRunner().run(["/nonexistent/llama-server", "--version"])

    assert res.returncode == 127 and not res.ok
    assert "not found" in res.output


async def test_a_command_that_runs_too_long_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    res = await SubprocessRunner().run(
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo started; wait"], timeout_s=0.5
    )

    assert res.timed_out and not res.ok
    assert "started" in res.output
    child = int(pidfile.read_text())
    async with asyncio.timeout(10):
        # Polled: a process that is not our child has nothing to wait on.
        while _alive(child):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_which_finds_a_program_on_path_and_not_one_absent() -> None:
    runner = SubprocessRunner()

    assert await runner.which("sh") is not None
    assert await runner.which("surely-no-such-program-here") is None
