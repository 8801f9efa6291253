"""The addresses a running server actually listens on, kept in its state directory for `llmgw ctl`.

server.yaml says where the admin listener should be, but `--admin-listen
127.0.0.1:0` (what dev mode and tests use) lets the system pick the port, and
`llmgw ctl --config server.yaml` then dialled the file's port and failed. So a
server, once listening, writes `<state_dir>/listening.json` (the process id and
each listener's bound host:port) and removes it when it stops; `ctl` prefers it
to server.yaml while that process lives.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import attrs
import structlog

from llmgw import durable, strictjson
from llmgw.addresses import url_host

log = structlog.get_logger(__name__)

FILE = "listening.json"


@attrs.frozen
class Listening:
    """Where one server process listens."""

    pid: int
    # host:port as bound, IPv6 hosts in brackets.
    gateway: str
    admin: str
    agent_port: int


def address(host: str, port: int) -> str:
    """host:port, an IPv6 host in brackets, as split_host_port reads it back."""
    return f"{url_host(host)}:{port}"


async def record(state_dir: Path, listening: Listening) -> Path | None:
    """Write listening to state_dir; the file, or None when it could not be written (logged, not fatal)."""
    try:
        return await asyncio.to_thread(_write, state_dir, listening)
    except OSError as exc:
        # ctl still finds a listener on the configured port; only a port picked at start is lost.
        log.warning(
            "could not record the addresses this server listens on; "
            "`llmgw ctl` will dial admin_listen from server.yaml",
            file=str(state_dir / FILE),
            error=str(exc),
        )
        return None


async def forget(path: Path, pid: int) -> None:
    """Remove the record at path if it is still this process's (a newer server may have replaced it)."""
    await asyncio.to_thread(_remove, path, pid)


def read(state_dir: Path) -> Listening | None:
    """The record of a server that is still running with state_dir; None when there is none. Blocking."""
    try:
        data = json.loads((state_dir / FILE).read_text(encoding="utf-8"))
        listening = Listening(
            pid=int(data["pid"]),
            gateway=str(data["gateway"]),
            admin=str(data["admin"]),
            agent_port=int(data["agent_port"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        # Absent, unreadable to this user, or torn: server.yaml's addresses are the best guess left.
        return None
    return listening if _alive(listening.pid) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        # A server killed before it could remove its record.
        return False
    except PermissionError:
        # Running as another user (the llmgw service user): it exists.
        return True
    return True


def _write(state_dir: Path, listening: Listening) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / FILE
    # Whole or absent: ctl reading while it is written must never see half of it.
    durable.write_atomically(path, strictjson.dumps(attrs.asdict(listening), indent=2) + "\n")
    return path


def _remove(path: Path, pid: int) -> None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass
