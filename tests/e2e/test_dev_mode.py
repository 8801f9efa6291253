"""`llmgw --dev`, driven with the official openai client as a user would."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path

import openai
import psutil
import pytest

from .conftest import RunningLlmgw, wait_until

pytestmark = pytest.mark.e2e


def test_the_openai_client_gets_a_chat_completion(dev_llmgw: RunningLlmgw) -> None:
    client = openai.OpenAI(base_url=f"{dev_llmgw.url}/v1", api_key=dev_llmgw.key)
    reply = client.chat.completions.create(
        model="sim-chat", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    # The sim engine echoes the prompt's words, one token each.
    assert reply.choices[0].message.content == "Hello there"
    assert reply.usage is not None and reply.usage.completion_tokens == 2


def test_the_openai_client_gets_a_streamed_chat_completion_with_usage(dev_llmgw: RunningLlmgw) -> None:
    client = openai.OpenAI(base_url=f"{dev_llmgw.url}/v1", api_key=dev_llmgw.key)
    stream = client.chat.completions.create(
        model="sim-chat",
        messages=[{"role": "user", "content": "one two three four five six seven"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == "one two three four five"
    assert usage is not None and usage.completion_tokens == 5


def test_a_request_without_a_key_is_refused(dev_llmgw: RunningLlmgw) -> None:
    client = openai.OpenAI(base_url=f"{dev_llmgw.url}/v1", api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="sim-chat", messages=[{"role": "user", "content": "hi"}])


def test_ctrl_c_leaves_no_engine_process_behind(dev_llmgw: RunningLlmgw) -> None:
    engines = [p for p in dev_llmgw.children() if "llmgw.engines.sim" in " ".join(p.cmdline())]
    assert engines, "the dev system should run a sim engine"
    assert dev_llmgw.stop(signal.SIGINT) == 0
    wait_until(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engines),
        10,
        "the engines to be gone",
    )


def test_dev_mode_keeps_its_authority_store_and_model_in_dot_llmgw_dev(
    dev_llmgw: RunningLlmgw, tmp_path: Path
) -> None:
    dev_dir = tmp_path / ".llmgw-dev"
    for name in ("pki/ca.pem", "pki/server.pem", "pki/dev-node.pem", "llmgw.db", "server.yaml", "agent.yaml"):
        assert (dev_dir / name).is_file(), f"{name} is missing from ./.llmgw-dev"
    assert "name: sim-chat" in (dev_dir / "server.yaml").read_text()
    assert (dev_dir / "llmgw.db").read_bytes()[:16] == b"SQLite format 3\x00"


def test_the_in_process_agent_registers_over_the_agent_service_with_its_certificate(
    dev_llmgw: RunningLlmgw,
) -> None:
    """The agent service speaks only mutual TLS (tests/control/stream/test_service.py); dev mode too."""
    events = [json.loads(line) for line in dev_llmgw.output if line.startswith("{")]
    (listening,) = [e for e in events if e["event"] == "agent service listening"]
    registered = [e for e in events if e["event"] == "registered with the control plane"]
    assert registered and registered[0]["node"] == "dev-node"
    assert registered[0]["server"].rsplit(":", 1)[1] == listening["address"].rsplit(":", 1)[1]


def test_the_banners_curl_line_gets_a_chat_completion(dev_llmgw: RunningLlmgw) -> None:
    (line,) = [line.strip() for line in dev_llmgw.output if line.strip().startswith("curl ")]
    reply = subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=30, check=True)
    body = json.loads(reply.stdout)
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "Hello"
