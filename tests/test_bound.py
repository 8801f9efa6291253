"""The addresses a server bound, recorded in its state directory: read while it lives, ignored after."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import bound


def _listening(pid: int) -> bound.Listening:
    return bound.Listening(pid=pid, gateway="127.0.0.1:40001", admin="127.0.0.1:40002", agent_port=40003)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def test_a_record_of_this_process_reads_back_whole(tmp_path: Path) -> None:
    listening = _listening(os.getpid())
    path = await bound.record(tmp_path / "state", listening)
    assert path == tmp_path / "state" / "listening.json"
    assert await asyncio.to_thread(bound.read, tmp_path / "state") == listening
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["listening.json"]


async def test_the_record_of_a_server_killed_outright_is_ignored(tmp_path: Path) -> None:
    """SIGKILL leaves the file behind; ctl must fall back to server.yaml, not dial a dead port."""
    await bound.record(tmp_path, _listening(await asyncio.to_thread(_dead_pid)))
    assert await asyncio.to_thread(bound.read, tmp_path) is None


async def test_a_server_removes_only_its_own_record(tmp_path: Path) -> None:
    path = await bound.record(tmp_path, _listening(os.getpid()))
    assert path is not None
    await bound.forget(path, os.getpid() + 1)
    assert path.exists()
    await bound.forget(path, os.getpid())
    assert not path.exists()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"pid": "x"}', '{"pid": 1}'])
def test_a_torn_or_foreign_record_is_no_record(tmp_path: Path, text: str) -> None:
    (tmp_path / "listening.json").write_text(text)
    assert bound.read(tmp_path) is None


async def test_a_state_directory_that_cannot_be_written_is_logged_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert await bound.record(blocker, _listening(1)) is None


def test_an_ipv6_address_is_bracketed_as_host_port_reads_it() -> None:
    assert bound.address("::1", 9090) == "[::1]:9090"
    assert bound.address("127.0.0.1", 1) == "127.0.0.1:1"
