"""Requests from the control plane's host to engines on other hosts: served, and only through it."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .cluster import Fleet, http
from .netns import Host

# Each role a real llmgw process on hosts made of network namespaces (conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SIM = {"name": "sim-chat", "replicas": 2, "profiles": [{"engine": "sim"}]}
_REQUESTS = "llmgw_sim_requests"


def _two_nodes(fleet: Fleet, **agent: Any) -> list[dict[str, Any]]:
    return fleet.start(["n1", "n2"], [SIM], **agent)


def _ask(gateway: str, key: str, question: str = "hello") -> tuple[str, str, str, int]:
    """A chat and a stream with the official client: (reply, its model header, streamed text, usage)."""
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=10)
    messages: list[Any] = [{"role": "user", "content": question}]
    raw = client.chat.completions.with_raw_response.create(model="sim-chat", messages=messages, max_tokens=8)
    reply = raw.parse()
    stream = client.chat.completions.create(
        model="sim-chat", messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    text, usage = "", 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage.total_tokens
    return reply.choices[0].message.content or "", raw.headers.get("x-llmgw-model", ""), text, usage


def _served(fleet: Fleet, shard_id: str) -> float:
    """How many requests the replica's engine says it answered (its own metrics, read by the server)."""
    samples = fleet.admin(f"replicas/{shard_id}/metrics")["metrics"]
    return sum(
        v for k, v in samples.items() if k.startswith(_REQUESTS) and not k.startswith(f"{_REQUESTS}_created")
    )


def test_a_chat_and_a_stream_from_the_control_plane_host_are_served_by_replicas_on_both_nodes(
    fleet: Fleet,
) -> None:
    replicas = _two_nodes(fleet)
    assert {r["node"] for r in replicas} == {"n1", "n2"}
    hosts = fleet.network.hosts
    assert {r["endpoint"].split("//")[1].rsplit(":", 1)[0] for r in replicas} == {
        hosts["n1"].address,
        hosts["n2"].address,
    }

    # Three different questions: the router sends a prompt where it was served before (router.policy
    # prefix), and a new one to the replica with the fewest in flight, ties taken in turn.
    for i in range(3):
        reply, model, streamed, usage = fleet.cp.call(_ask, fleet.gateway, fleet.key, f"hello {i}")
        assert reply and streamed and usage > 0
        assert model == "sim-chat"

    assert all(_served(fleet, r["shard_id"]) > 0 for r in replicas), "a replica served nothing"


def _direct(host: Host, endpoint: str, secret: str | None) -> int:
    headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return host.call(http, "POST", f"{endpoint}/v1/chat/completions", body, headers).status


def test_an_engine_called_directly_without_the_replicas_secret_is_refused(fleet: Fleet) -> None:
    replicas = _two_nodes(fleet)
    endpoint = replicas[0]["endpoint"]

    # From the control plane's host and from the other node: reachable, and refused.
    other = fleet.network.hosts["n2" if replicas[0]["node"] == "n1" else "n1"]
    for host in (fleet.cp, other):
        assert _direct(host, endpoint, None) == 401
        assert _direct(host, endpoint, fleet.key) == 401
    assert fleet.chat("sim-chat").status == 200


def test_engines_listen_only_on_ports_from_engine_ports(fleet: Fleet) -> None:
    replicas = _two_nodes(fleet, engine_ports="21000-21009")

    for replica in replicas:
        assert 21000 <= int(replica["endpoint"].rsplit(":", 1)[1]) <= 21009, replica
    for name in ("n1", "n2"):
        listening = fleet.network.hosts[name].listening_ports()
        assert listening, f"nothing listens on {name}"
        assert all(21000 <= port <= 21009 for _, port in listening), f"{name}: {listening}"
