"""Whole-system fixtures: `llmgw` started as a subprocess, as a person starts it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import psutil
import pytest

_BANNER = re.compile(r"Gateway: (?P<url>http://\S+)")
_KEY = re.compile(r"API key \(shown once\): (?P<key>\S+)")


@attrs.define
class RunningLlmgw:
    process: subprocess.Popen[str]
    url: str
    key: str
    output: list[str]

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)


def _pump(stream: object, sink: list[str], seen: threading.Event) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.append(line.rstrip("\n"))
        seen.set()


def wait_until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def post_json(url: str, body: object, key: str) -> tuple[int, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


@pytest.fixture
def dev_llmgw(tmp_path: Path) -> Iterator[RunningLlmgw]:
    """`llmgw --role=server --role=agent --dev` on a free port, with sim-chat ready."""
    with launch_dev(tmp_path) as running:
        yield running


@contextlib.contextmanager
def launch_dev(tmp_path: Path, model: str = "sim-chat", args: Sequence[str] = ()) -> Iterator[RunningLlmgw]:
    """Start dev mode in tmp_path/.llmgw-dev (its files kept if present), with args after the others;
    wait until model answers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "--log-format=json",
            "--role=server",
            "--role=agent",
            # No --dev-dir: started in tmp_path, dev mode keeps everything in ./.llmgw-dev.
            "--dev",
            "--listen",
            "127.0.0.1:0",
            # Several dev systems may run at once on one machine (tests in parallel): none may
            # hold the admin listener's default port.
            "--admin-listen",
            "127.0.0.1:0",
            *args,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    seen = threading.Event()
    pump = threading.Thread(target=_pump, args=(process.stdout, output, seen), daemon=True)
    pump.start()
    try:

        def banner() -> bool:
            text = "\n".join(output)
            return bool(_BANNER.search(text) and _KEY.search(text)) or process.poll() is not None

        wait_until(banner, 60, "the dev banner")
        text = "\n".join(output)
        url, key = _BANNER.search(text), _KEY.search(text)
        assert url and key, "llmgw exited before printing its banner:\n" + text
        running = RunningLlmgw(process=process, url=url["url"], key=key["key"], output=output)

        def ready() -> bool:
            return (
                post_json(
                    f"{running.url}/v1/chat/completions",
                    {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                    running.key,
                )[0]
                == 200
            )

        wait_until(ready, 60, f"{model} to have a ready replica")
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        pump.join(timeout=10)
        assert process.stdout is not None
        process.stdout.close()
