"""A node that drops off the network, and an agent that dies: what the control plane and the gateway do."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from .cluster import Fleet, Reply, log_events
from .netns import wait_until

# Each role a real llmgw process on hosts made of network namespaces (conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SIM = {"name": "sim-chat", "replicas": 1, "profiles": [{"engine": "sim"}]}


def _started(fleet: Fleet, node: str) -> list[str]:
    """The shards node's agents started an engine for (adopted ones are not started)."""
    return [e["shard"] for e in log_events(fleet.agents[node]) if e.get("event") == "engine starting"]


def _in_flight(fleet: Fleet, shard_id: str) -> bool:
    samples = fleet.admin(f"replicas/{shard_id}/metrics")["metrics"]
    return any(
        k.startswith("llmgw_sim_requests") and "created" not in k and v > 0 for k, v in samples.items()
    )


def _cut_the_replicas_node(fleet: Fleet) -> tuple[str, str, str]:
    """(the node cut, its replica's shard id, the node the replica moved to)."""
    [replica] = fleet.start(["n1", "n2"], [SIM])
    lost, shard = replica["node"], replica["shard_id"]
    other = "n2" if lost == "n1" else "n1"

    fleet.network.hosts[lost].cut_link()

    wait_until(lambda: not fleet.nodes()[lost]["reachable"], 60, f"{lost} to be marked unreachable")
    moved = wait_until(
        lambda: [r for r in fleet.replicas("sim-chat") if r["node"] == other and r["state"] == "ready"],
        90,
        f"a replacement replica ready on {other}",
    )
    # The cut node's engine stays routed until the server's own check of it fails (an engine whose
    # agent is away may well still answer the gateway: control/engine_checks.py).
    wait_until(lambda: fleet.routed("sim-chat") == 1, 60, f"the engine on {lost} to leave the routing table")
    assert fleet.chat("sim-chat").status == 200
    assert moved[0]["shard_id"] != shard
    return lost, shard, other


def test_a_node_whose_link_is_cut_leaves_the_routing_table_and_its_replicas_start_elsewhere(
    fleet: Fleet,
) -> None:
    lost, shard, other = _cut_the_replicas_node(fleet)

    assert not fleet.nodes()[lost]["reachable"]
    # Its replica may still be listed, but the one replica routed to is the replacement.
    assert fleet.routed("sim-chat") == 1
    assert shard not in [r["shard_id"] for r in fleet.replicas("sim-chat") if r["node"] == other]


def test_a_request_in_flight_to_a_node_whose_link_is_cut_ends_with_a_502_naming_the_node(
    fleet: Fleet,
) -> None:
    # An engine slow enough that the request is still waiting for its first token when the link goes.
    slow = {**SIM, "profiles": [{"engine": "sim", "args": ["--ttft-ms", "60000"]}]}
    [replica] = fleet.start(["n1", "n2"], [slow])
    replies: list[Reply] = []
    asking = threading.Thread(
        target=lambda: fleet.cp.call_here(lambda: replies.append(fleet.chat("sim-chat", 180)))
    )
    asking.start()
    wait_until(lambda: _in_flight(fleet, replica["shard_id"]), 30, "the request to reach the engine")

    fleet.network.hosts[replica["node"]].cut_link()
    # Nothing was sent yet: the request moves to the replica placed on the other node, which is as
    # slow and is found stalled there in turn; the answer names both, the cut node first tried.
    asking.join(180)

    [reply] = replies
    assert reply.status == 502
    message = reply.body["error"]["message"]
    assert replica["node"] in message, message


def test_a_node_whose_link_is_restored_has_its_engines_adopted_not_duplicated(fleet: Fleet) -> None:
    lost, shard, other = _cut_the_replicas_node(fleet)

    fleet.network.hosts[lost].restore_link()

    wait_until(lambda: fleet.nodes()[lost]["reachable"], 90, f"{lost} to be reachable again")

    def settled() -> list[dict[str, Any]]:
        replicas = fleet.replicas("sim-chat")
        return replicas if len(replicas) == 1 and replicas[0]["state"] == "ready" else []

    # Its engine was reported again and counted as what it is: a surplus replica, stopped;
    # never started a second time there.
    [kept] = wait_until(settled, 60, "one replica of sim-chat, as the catalog wants")
    assert _started(fleet, lost) == [shard]
    assert len(set(_started(fleet, other))) == 1
    assert fleet.chat("sim-chat").status == 200
    assert kept["node"] in (lost, other)


def test_a_killed_agent_comes_back_and_adopts_its_engines_while_the_gateway_keeps_serving(
    fleet: Fleet,
) -> None:
    two = {**SIM, "replicas": 2}
    # A grace longer than the agent's restart: the replicas stay routed while it is away.
    replicas = fleet.start(["n1", "n2"], [two], server={"control": {"interval_s": 0.5, "grace_s": 20.0}})
    before = {r["shard_id"]: r["endpoint"] for r in replicas}
    statuses: list[int] = []
    done = threading.Event()

    def keep_asking() -> None:
        while not done.is_set():
            statuses.append(fleet.chat("sim-chat").status)

    asking = threading.Thread(target=lambda: fleet.cp.call(keep_asking))
    asking.start()
    try:
        fleet.agents["n1"].signal_group(signal.SIGKILL)
        fleet.agents["n1"].popen.wait(10)
        agent = fleet.restart_agent(fleet.network.hosts["n1"])
        wait_until(
            lambda: any(e.get("event") == "registered with the control plane" for e in log_events(agent)),
            60,
            "the restarted agent to register",
        )
        wait_until(lambda: len(statuses) >= 20, 60, "requests to be served after the restart")
    finally:
        done.set()
        asking.join()

    adopted = [e["shard"] for e in log_events(agent) if e.get("event", "").startswith("adopted an engine")]
    assert adopted and all(shard in before for shard in adopted)
    assert not [e for e in log_events(agent) if e.get("event") == "engine starting"]
    assert {r["shard_id"]: r["endpoint"] for r in fleet.wait_ready("sim-chat", 2)} == before
    assert set(statuses) == {200}, f"{statuses.count(200)} of {len(statuses)} requests were served"
