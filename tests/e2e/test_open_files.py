"""A server holds one open file per connection: it raises its limit at start, and says so when it runs out.

Each test starts `llmgw --role=server` as a process whose soft limit of open
files is low, as a process started by systemd or a login shell has it (1,024),
and opens more connections to its gateway than that limit allows.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import bound, config
from llmgw.roles.dev import prepare_dev

from .conftest import wait_until

pytestmark = pytest.mark.e2e


class Server:
    def __init__(self, process: subprocess.Popen[str], port: int, output: list[str]) -> None:
        self.process = process
        self.port = port
        self.output = output

    def log(self) -> str:
        return "\n".join(self.output)


@contextlib.contextmanager
def server_with_limit(tmp_path: Path, soft: int, hard: int) -> Iterator[Server]:
    setup = prepare_dev(tmp_path / "dev", ("server",))
    assert setup.server is not None
    cfg = config.evolve(setup.server, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", models=[])
    (tmp_path / "dev" / "server.yaml").write_text(config.dump(cfg))
    process = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "--role=server", "--config", str(tmp_path / "dev" / "server.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    output: list[str] = []
    lines = process.stdout
    assert lines is not None
    pump = threading.Thread(target=lambda: output.extend(line.rstrip() for line in lines), daemon=True)
    pump.start()
    try:
        wait_until(
            lambda: bound.read(tmp_path / "dev") is not None or process.poll() is not None, 60, "the server"
        )
        listening = bound.read(tmp_path / "dev")
        assert listening is not None, "\n".join(output)
        yield Server(process, int(listening.gateway.rsplit(":", 1)[1]), output)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        pump.join(5)
        lines.close()


def answered(port: int, count: int, within_s: float = 10.0) -> int:
    """How many of count connections, each asking GET /health at once, got an answer within within_s."""
    selector = selectors.DefaultSelector()
    waiting = set()
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            connection = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: llmgw\r\n\r\n")
            connection.setblocking(False)
            selector.register(connection, selectors.EVENT_READ)
            waiting.add(connection)
        deadline = time.monotonic() + within_s
        answers = 0
        while waiting and time.monotonic() < deadline:
            for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                connection = key.fileobj
                assert isinstance(connection, socket.socket)
                if connection.recv(16).startswith(b"HTTP/1.1 200"):
                    answers += 1
                selector.unregister(connection)
                waiting.discard(connection)
        selector.close()
    return answers


def test_a_server_started_with_a_soft_limit_of_200_files_takes_400_connections_at_once(tmp_path):
    with server_with_limit(tmp_path, soft=200, hard=4096) as server:
        limits = Path(f"/proc/{server.process.pid}/limits").read_text()
        [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3:5] == ["4096", "4096"], line
        assert answered(server.port, 400) == 400


def test_a_server_out_of_open_files_says_why_in_its_log_and_serves_again_once_they_close(tmp_path):
    with server_with_limit(tmp_path, soft=200, hard=200) as server:
        wait_until(lambda: "may have only 200 files open at once" in server.log(), 10, "the warning")
        # More than it can hold: those past the limit wait, unanswered, while it has no file left.
        assert answered(server.port, 300, within_s=3) < 300
        wait_until(lambda: "open files are all in use" in server.log(), 10, "the sentence")
        assert (
            "cannot accept a connection: this server's open files are all in use (this server's limit is "
            "200, one per connected node and client connection); raise LimitNOFILE= in its systemd unit "
            "(or `ulimit -n`); it tries again in a second"
        ) in server.log()
        assert "Traceback" not in server.log()
        # Nothing was lost: with the connections closed it serves again.
        wait_until(lambda: answered(server.port, 20, within_s=3) == 20, 30, "the server to answer again")
