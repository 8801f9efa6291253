"""`llmgw --loop uvloop`: the whole system on uvloop's event loop instead of asyncio's own."""

from __future__ import annotations

import signal
from pathlib import Path

import openai
import psutil
import pytest

from .conftest import launch_dev

pytestmark = pytest.mark.e2e


def test_on_uvloop_a_node_joins_over_mutual_tls_a_chat_is_answered_and_a_signal_stops_it_cleanly(
    tmp_path: Path,
) -> None:
    # launch_dev waits for sim-chat to have a ready replica: the dev node dialled the agent
    # service over mutual TLS and registered, all on uvloop.
    with launch_dev(tmp_path, args=["--loop", "uvloop"]) as running:
        loaded = {Path(m.path).name for m in psutil.Process(running.process.pid).memory_maps()}
        assert any(name.startswith("loop.cpython") for name in loaded), "uvloop was not loaded"
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key=running.key)
        reply = client.chat.completions.create(
            model="sim-chat", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
        )
        assert reply.choices[0].message.content == "Hello there"
        streamed = client.chat.completions.create(
            model="sim-chat",
            messages=[{"role": "user", "content": "one two three"}],
            max_tokens=8,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "one two three"
        # The roles' signal handlers are the loop's: the first SIGTERM drains and exits 0.
        assert running.stop(signal.SIGTERM, timeout=30) == 0
