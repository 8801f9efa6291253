"""Which control plane an agent reaches across hosts, and what each side says when it cannot."""

from __future__ import annotations

import time

import pytest

from .cluster import AGENT_PORT, Fleet, log_events
from .conftest import CP_UNNAMED
from .netns import UNROUTED, wait_until

# Each role a real llmgw process on hosts made of network namespaces (conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_HANDSHAKE_FAILED = "a TLS handshake on the agent service failed"
SIM = {"name": "sim-chat", "replicas": 1, "profiles": [{"engine": "sim"}]}


def test_an_agent_whose_first_server_has_no_route_connects_to_the_second(fleet: Fleet) -> None:
    fleet.start_server([SIM])
    n1 = fleet.network.hosts["n1"]
    agent = fleet.start_agent(n1, servers=[f"{UNROUTED}:{AGENT_PORT}", f"{fleet.cp.address}:{AGENT_PORT}"])

    fleet.wait_connected("n1")

    def registered() -> list[str]:
        return [
            e["server"] for e in log_events(agent) if e.get("event") == "registered with the control plane"
        ]

    assert wait_until(registered, 30, "the agent to log its registration") == [
        f"{fleet.cp.address}:{AGENT_PORT}"
    ]
    failures = [e for e in log_events(agent) if e.get("server") == f"{UNROUTED}:{AGENT_PORT}"]
    assert failures, "the agent did not say why the first server failed"
    assert "unreachable" in failures[0]["error"].lower(), failures[0]


def test_a_server_certificate_that_does_not_name_the_dialled_address_is_reported_in_words_on_both_sides(
    fleet: Fleet,
) -> None:
    server = fleet.start_server([SIM])
    dialled = f"{CP_UNNAMED}:{AGENT_PORT}"
    agent = fleet.start_agent(fleet.network.hosts["n1"], servers=[dialled])

    def agent_said() -> list[str]:
        return [e["error"] for e in log_events(agent) if e.get("server") == dialled and "error" in e]

    def server_said() -> list[str]:
        return [str(e.get("error")) for e in log_events(server) if e.get("event") == _HANDSHAKE_FAILED]

    said = wait_until(agent_said, 60, "the agent to report the mismatch")
    assert f"does not name {CP_UNNAMED}" in said[0], said[0]
    assert "198.18.0.1" in said[0], "the agent should say which names the certificate has"
    heard = wait_until(server_said, 30, "the server to report the refused handshake")
    assert "does not accept this server's certificate" in heard[0], heard[0]
    assert "n1" not in fleet.nodes()


def test_an_agent_whose_first_server_is_silent_gives_up_on_it_and_connects_to_the_second(
    fleet: Fleet,
) -> None:
    # A machine that vanished behind a router answers nothing, not even "unreachable": its SYNs
    # go out and are dropped. Here, an address n1 believes is on the wire, at a MAC no host has.
    n1 = fleet.network.hosts["n1"]
    silent = "198.18.0.99"
    n1.exec(
        ["ip", "neigh", "replace", silent, "lladdr", "02:00:00:00:00:99", "dev", "eth0", "nud", "permanent"]
    )
    try:
        fleet.start_server([SIM])
        started = time.monotonic()
        fleet.start_agent(n1, servers=[f"{silent}:{AGENT_PORT}", f"{fleet.cp.address}:{AGENT_PORT}"])
        fleet.wait_connected("n1", timeout_s=60)
        print(f"\nconnected past a silent server after {time.monotonic() - started:.1f} s")
    finally:
        n1.exec(["ip", "neigh", "del", silent, "dev", "eth0"])
