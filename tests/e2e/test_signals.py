"""Stopping llmgw: the first signal drains, a second one forces the exit; no engine survives either."""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from pathlib import Path

import psutil
import pytest

from llmgw import config
from llmgw.config import ModelConfig, ProfileConfig
from llmgw.roles.dev import prepare_dev

from .conftest import launch_dev, wait_until

pytestmark = pytest.mark.e2e


def _with_a_slow_model(tmp_path: Path, tokens_per_s: int = 2, drain_timeout_s: float = 10.0) -> None:
    dev_dir = tmp_path / ".llmgw-dev"
    setup = prepare_dev(dev_dir, ("server",))
    assert setup.server is not None
    slow = ModelConfig(
        name="sim-slow", profiles=[ProfileConfig(engine="sim", args=["--tokens-per-s", str(tokens_per_s)])]
    )
    server = config.evolve(setup.server, models=[*setup.server.models, slow], drain_timeout_s=drain_timeout_s)
    (dev_dir / "server.yaml").write_text(config.dump(server))


def _start_a_long_stream(
    url: str, key: str, started: threading.Event, received: list[bytes] | None = None, tokens: int = 500
) -> None:
    body = {
        "model": "sim-slow",
        "stream": True,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": " ".join(["word"] * tokens)}],
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            reply.readline()
            started.set()
            rest = reply.read()
            if received is not None:
                received.append(rest)
    except Exception:
        started.set()


def test_a_second_signal_forces_the_exit_and_kills_every_engine(tmp_path: Path) -> None:
    _with_a_slow_model(tmp_path)
    with launch_dev(tmp_path, model="sim-slow") as running:
        engines = [p for p in running.children() if "llmgw.engines.sim" in " ".join(p.cmdline())]
        assert len(engines) == 2
        started = threading.Event()
        client = threading.Thread(target=_start_a_long_stream, args=(running.url, running.key, started))
        client.start()
        assert started.wait(30)
        # The first signal starts a drain that the 250-second stream would hold open...
        running.process.send_signal(signal.SIGTERM)
        wait_until(lambda: any("draining" in line for line in running.output), 10, "the drain to start")
        # ...and the second one ends it at once.
        assert running.stop(signal.SIGTERM, timeout=30) == 130
        wait_until(
            lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines),
            10,
            "the engines to be gone",
        )
        client.join(timeout=30)


def test_the_first_signal_lets_a_request_in_flight_finish_then_exits_cleanly(tmp_path: Path) -> None:
    # 20 tokens at 10 a second: the stream is still going when the signal comes.
    _with_a_slow_model(tmp_path, tokens_per_s=10)
    with launch_dev(tmp_path, model="sim-slow") as running:
        engines = [p for p in running.children() if "llmgw.engines.sim" in " ".join(p.cmdline())]
        started, received = threading.Event(), []
        client = threading.Thread(
            target=_start_a_long_stream, args=(running.url, running.key, started, received, 20)
        )
        client.start()
        assert started.wait(30)
        assert running.stop(signal.SIGTERM, timeout=30) == 0
        client.join(timeout=30)
        assert received and received[0].endswith(b"data: [DONE]\n\n"), "the stream was cut short"
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines)


def test_the_drain_gives_up_on_a_request_at_the_drain_timeout(tmp_path: Path) -> None:
    # A 250-second stream and a one-second drain: the server stops without waiting for it.
    _with_a_slow_model(tmp_path, drain_timeout_s=1.0)
    with launch_dev(tmp_path, model="sim-slow") as running:
        started = threading.Event()
        client = threading.Thread(target=_start_a_long_stream, args=(running.url, running.key, started))
        client.start()
        assert started.wait(30)
        # Giving up on a request at the drain timeout is the drain working, not a failure.
        assert running.stop(signal.SIGTERM, timeout=30) == 0
        client.join(timeout=30)
        assert any('"stopped"' in line for line in running.output)
