"""A replica spanning two nodes: its ranks find rank 0 at an address the other host reaches."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from llmgw.agent.state import read_state

from .cluster import Fleet

# Each role a real llmgw process on hosts made of network namespaces (conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TWO_NODES = {"name": "sim-2n", "replicas": 1, "profiles": [{"engine": "sim", "nodes": 2}]}


def _listen(address: str, port: int) -> socket.socket:
    listener = socket.create_server((address, port))
    listener.settimeout(10)
    return listener


def _reach(address: str, port: int) -> bool:
    with socket.create_connection((address, port), timeout=10):
        return True


def test_a_two_node_replica_gets_a_master_addr_the_other_host_can_reach(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start(["n1", "n2"], [TWO_NODES], fake_hca=True, fabric="ib-test")

    starts = {node: [r.request for r in read_state(tmp_path / node)] for node in ("n1", "n2")}
    assert all(len(s) == 1 for s in starts.values()), starts
    ranks = {node: s[0] for node, s in starts.items()}
    [first] = [node for node, req in ranks.items() if req.rank == 0]
    [other] = [node for node, req in ranks.items() if req.rank != 0]
    master_addr, master_port = ranks[first].master_addr, ranks[first].master_port
    assert {(req.master_addr, req.master_port) for req in ranks.values()} == {(master_addr, master_port)}
    hosts = fleet.network.hosts
    assert master_addr == hosts[first].address

    # Rank 0's rendezvous, as a real engine would open it there; the other rank dials it.
    listener = hosts[first].call(_listen, master_addr, master_port)
    try:
        assert hosts[other].call(_reach, master_addr, master_port)
    finally:
        listener.close()
