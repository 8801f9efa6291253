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


def _with_a_slow_model(tmp_path: Path) -> None:
    dev_dir = tmp_path / ".llmgw-dev"
    setup = prepare_dev(dev_dir, ("server",))
    assert setup.server is not None
    slow = ModelConfig(name="sim-slow", profiles=[ProfileConfig(engine="sim", args=["--tokens-per-s", "2"])])
    server = config.evolve(setup.server, models=[*setup.server.models, slow])
    (dev_dir / "server.yaml").write_text(config.dump(server))


def _start_a_long_stream(url: str, key: str, started: threading.Event) -> None:
    body = {
        "model": "sim-slow",
        "stream": True,
        "max_tokens": 500,
        "messages": [{"role": "user", "content": " ".join(["word"] * 500)}],
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
            reply.read()
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
