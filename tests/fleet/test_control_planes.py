"""Two control planes on hosts of their own sharing a PostgreSQL on a third: the leader fails.

PostgreSQL runs inside the `db` host (198.18.0.31); `cp` (198.18.0.1) and `cp2`
(198.18.0.3) each run `llmgw --role=server` on it with a name and an advertised
address of their own; n1's agent lists the standby first; n2 sends steady traffic
(about 50 requests a second) through the standby's gateway. The leader is then
either SIGKILLed or its host unplugged, and the standby must take over: the agent
reconnects to it, its running engine is adopted (the same process, no second one),
and placement goes on. Or both are rolled as for an upgrade (docs/operations.md,
Upgrading): the standby stopped and started again, then the leader, under traffic
through both gateways from clients that fail over as a load balancer would.
"""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmgw.agent import state as engine_state

from ..postgres import running_cluster
from ..postgres import unavailable as postgres_unavailable
from .cluster import AGENT_PORT, GATEWAY_PORT, Fleet, http, log_events
from .netns import Host, Network, Process, wait_until
from .traffic import Traffic

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The hosts this module adds to the session's network, and removes after it.
CP2, DB = ("cp2", 3), ("db", 31)
MODEL = {"name": "sim-chat", "replicas": 1, "profiles": [{"engine": "sim"}]}
ADDED = {"name": "sim-added", "replicas": 1, "profiles": [{"engine": "sim"}]}
WAIT_S = 90.0
# Clients on n2 and the pause each takes between requests: about 50 requests a second in all.
CLIENTS = 4
PAUSE_S = 0.075
# docs/operations.md, "Takeover": a new leader within 7 s of the old one's host vanishing, its
# agents connected within 10 s. The figures are sampled every 0.1 s, and the samples are late
# by as much again on a loaded machine.
LEADS_WITHIN_S = 7.0 + 1.0
CONNECTED_WITHIN_S = 10.0 + 1.0


@attrs.define
class Plane:
    """One `llmgw --role=server` on a host of its own, asked from that host."""

    name: str
    host: Host
    process: Process
    token: str

    @property
    def gateway(self) -> str:
        return f"http://{self.host.address}:{GATEWAY_PORT}"

    def admin(self, path: str) -> Any:
        """GET admin/api/v1/path's body; None when the server does not answer 200."""
        reply = self.host.call(
            http,
            "GET",
            f"{self.gateway}/admin/api/v1/{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout_s=5.0,
        )
        return reply.body if reply.status == 200 else None

    def role(self) -> tuple[str, str]:
        """(leader or standby, the leader's name), as its status says."""
        plane = (self.admin("status") or {}).get("control_plane") or {}
        return plane.get("role", ""), plane.get("leader", "")

    def connected(self, node: str) -> bool:
        return any(n["id"] == node and n["connected"] for n in self.admin("nodes") or [])

    def ready(self, model: str) -> list[dict[str, Any]]:
        replicas = self.admin(f"replicas?model={model}") or []
        return [r for r in replicas if r["state"] == "ready"]

    def add_model(self, model: dict[str, Any]) -> None:
        reply = self.host.call(
            http,
            "POST",
            f"{self.gateway}/admin/api/v1/models",
            model,
            {"Authorization": f"Bearer {self.token}"},
        )
        assert reply.status in (200, 201), f"adding {model['name']}: {reply.status} {reply.body}"


@pytest.fixture(scope="module")
def hosts(network: Network) -> Iterator[tuple[Host, Host]]:
    """(cp2, db): a second control-plane host and a database host, removed after the module."""
    try:
        yield network.add_host(*CP2), network.add_host(*DB)
    finally:
        for name in (DB[0], CP2[0]):
            if name in network.hosts:
                network.remove_host(name)


@pytest.fixture
def database(fleet: Fleet, hosts: tuple[Host, Host]) -> Iterator[str]:
    """A PostgreSQL cluster inside the db host, listening on its address; the URL of a fresh database.

    After `fleet` in the fixtures, so it is stopped before the fleet's processes are.
    """
    why = postgres_unavailable()
    if why:
        pytest.fail(why, pytrace=False)
    db = hosts[1]
    with running_cluster(listen=(db.address,), wrap=("ip", "netns", "exec", db.netns)) as cluster:
        yield cluster.fresh_database()


def _plane_config(fleet: Fleet, name: str, host: Host, url: str) -> Path:
    return fleet.server_config(
        [MODEL],
        host=host,
        name=name,
        database=url,
        # The gateway is what is measured; the keys' store is tested elsewhere.
        auth={"enabled": False},
        # A grace longer than the takeover: the new leader waits for the agent to come back
        # rather than place the model's replica a second time.
        control={
            "interval_s": 0.5,
            "grace_s": 20.0,
            "base_backoff_s": 1.0,
            "name": name,
            "advertise": f"{host.address}:{AGENT_PORT}",
        },
    )


def _planes(fleet: Fleet, cp2: Host, url: str) -> list[Plane]:
    """Both servers, cp1 on cp and cp2 on cp2, each started once the one before answers."""
    planes = []
    for name, host in (("cp1", fleet.cp), ("cp2", cp2)):
        path = _plane_config(fleet, name, host, url)
        planes.append(Plane(name, host, fleet.run_server(host, path, name), fleet.admin_token))
    return planes


def _leader_and_standby(planes: list[Plane]) -> tuple[Plane, Plane]:
    name = wait_until(lambda: planes[1].role()[1], WAIT_S, "a leader")
    [leader] = [p for p in planes if p.name == name]
    [standby] = [p for p in planes if p is not leader]
    assert leader.role() == ("leader", leader.name)
    assert standby.role() == ("standby", leader.name)
    return leader, standby


def _started(fleet: Fleet, node: str) -> list[str]:
    """The shards node's agent started an engine for (adopted ones are not started)."""
    return [e["shard"] for e in log_events(fleet.agents[node]) if e.get("event") == "engine starting"]


def _steady(
    fleet: Fleet, url: str, hosts: tuple[Host, Host], through_both: bool = False
) -> tuple[Plane, Plane, dict[str, Any], int, Traffic]:
    """Both planes, the agent on n1 connected to the leader with the model's replica ready, and
    traffic through the standby's gateway (through_both: and the leader's, each client failing over
    to the other): (leader, standby, the replica, its engine's pid, traffic)."""
    leader, standby = _leader_and_standby(_planes(fleet, hosts[0], url))
    # The standby first: the agent must find the leader whatever the order.
    fleet.start_agent(
        fleet.network.hosts["n1"],
        servers=[f"{p.host.address}:{AGENT_PORT}" for p in (standby, leader)],
    )
    wait_until(lambda: leader.connected("n1"), WAIT_S, "the agent to connect to the leader")
    assert not standby.connected("n1")
    [replica] = wait_until(lambda: leader.ready(MODEL["name"]), WAIT_S, "the replica to be ready")
    [record] = engine_state.read_state(fleet.workdir / "n1")
    # The standby routes to it too, from the table the leader published.
    wait_until(lambda: standby.ready(MODEL["name"]) or _served(standby), WAIT_S, "the standby to route")
    gateways = [standby.gateway, leader.gateway] if through_both else [standby.gateway]
    traffic = Traffic(
        fleet.network.hosts["n2"], gateways, str(MODEL["name"]), clients=CLIENTS, pause_s=PAUSE_S
    )
    traffic.start()
    try:
        traffic.wait_for(100, WAIT_S)
    except BaseException:
        traffic.stop()
        raise
    return leader, standby, replica, record.pid, traffic


def _served(plane: Plane) -> bool:
    body = {"model": MODEL["name"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return plane.host.call(http, "POST", f"{plane.gateway}/v1/chat/completions", body).status == 200


def _adopted(fleet: Fleet, new_leader: Plane, replica: dict[str, Any], pid: int) -> None:
    """The new leader has the very replica, its engine the same process, started once only."""
    [after] = new_leader.ready(MODEL["name"])
    assert after["shard_id"] == replica["shard_id"]
    records = {r.request.shard_id: r.pid for r in engine_state.read_state(fleet.workdir / "n1")}
    assert records == {replica["shard_id"]: pid}
    assert _started(fleet, "n1") == [replica["shard_id"]]


def _logged_at(plane: Plane, event: str) -> float:
    """When plane's server last logged event (its JSON line's UTC timestamp), in seconds since the epoch."""
    stamps = [e["timestamp"] for e in log_events(plane.process) if e.get("event") == event]
    assert stamps, f"{plane.name} never logged {event!r}"
    return datetime.datetime.fromisoformat(stamps[-1]).timestamp()


def _placement_goes_on(new_leader: Plane) -> None:
    new_leader.add_model(dict(ADDED))
    wait_until(lambda: new_leader.ready(ADDED["name"]), WAIT_S, "the added model to be placed")


def test_killing_the_leader_under_traffic_through_the_standby_fails_no_request_and_adopts_the_replica(
    fleet: Fleet, database: str, hosts: tuple[Host, Host]
) -> None:
    leader, standby, replica, pid, traffic = _steady(fleet, database, hosts)
    try:
        killed = time.monotonic()
        leader.process.signal_group(signal.SIGKILL)
        leader.process.popen.wait(10)
        wait_until(lambda: standby.role()[0] == "leader", WAIT_S, "the standby to take over", every_s=0.05)
        led = time.monotonic()
        wait_until(lambda: standby.connected("n1"), WAIT_S, "the agent to reach the new leader", every_s=0.05)
        connected = time.monotonic()
        wait_until(lambda: standby.ready(MODEL["name"]), WAIT_S, "the replica to be adopted", every_s=0.05)
        adopted = time.monotonic()
        _adopted(fleet, standby, replica, pid)
        _placement_goes_on(standby)
        # A few more seconds of traffic under the new leader, then the count.
        traffic.wait_for(100, WAIT_S)
    finally:
        traffic.stop()

    during = [s for when, s in traffic.outcomes if killed <= when <= adopted + 1]
    failed = traffic.failed()
    print(
        f"\nacross hosts, leader SIGKILLed -> standby leads: {led - killed:.2f} s; -> agent connected: "
        f"{connected - killed:.2f} s; -> replica adopted: {adopted - killed:.2f} s; "
        f"requests through the standby: {len(traffic.outcomes)} at {traffic.rate():.0f}/s "
        f"({len(during)} during the takeover), failed: {len(failed)}"
    )
    assert failed == [], f"{len(failed)} requests failed through the standby's gateway: {failed[:10]}"


def test_when_the_leaders_host_vanishes_the_standby_takes_over_within_the_bound_and_the_old_leader_steps_down(
    fleet: Fleet, database: str, hosts: tuple[Host, Host]
) -> None:
    leader, standby, replica, pid, traffic = _steady(fleet, database, hosts)
    try:
        cut, cut_at = time.monotonic(), time.time()
        leader.host.cut_link()
        wait_until(lambda: standby.role()[0] == "leader", WAIT_S, "the standby to take over", every_s=0.1)
        led = time.monotonic()
        wait_until(lambda: standby.connected("n1"), WAIT_S, "the agent to reach the new leader", every_s=0.1)
        connected = time.monotonic()
        wait_until(lambda: standby.ready(MODEL["name"]), WAIT_S, "the replica to be adopted", every_s=0.1)
        adopted = time.monotonic()
        # The old leader, cut off from PostgreSQL, has let go: it accepts no agent any more.
        wait_until(lambda: leader.role()[0] == "standby", WAIT_S, "the old leader to step down")
        stepped_down = _logged_at(leader, "this control plane is no longer the leader")
        took_over = _logged_at(standby, "this control plane is now the leader")
        _adopted(fleet, standby, replica, pid)
        _placement_goes_on(standby)
        traffic.wait_for(50, WAIT_S)
    finally:
        traffic.stop()
        leader.host.restore_link()

    # Back on the network, it finds the lock taken and names the new leader.
    wait_until(
        lambda: leader.role() == ("standby", standby.name), WAIT_S, "the old leader to name the new one"
    )
    failed = traffic.failed()
    print(
        f"\nacross hosts, leader's link cut -> standby leads: {led - cut:.2f} s; -> agent connected: "
        f"{connected - cut:.2f} s; -> replica adopted: {adopted - cut:.2f} s; old leader stepped down: "
        f"{stepped_down - cut_at:.2f} s; requests through the standby: {len(traffic.outcomes)} at "
        f"{traffic.rate():.0f}/s, failed: {len(failed)}"
    )
    # Never two leaders at once: the old one let go before the lock could pass.
    assert stepped_down < took_over, f"{took_over - stepped_down:.2f} s with two leaders"
    assert led - cut <= LEADS_WITHIN_S, f"the standby led {led - cut:.1f} s after the cut"
    assert connected - cut <= CONNECTED_WITHIN_S, (
        f"the agent reached it {connected - cut:.1f} s after the cut"
    )
    assert failed == [], f"{len(failed)} requests failed through the standby's gateway: {failed[:10]}"


def _started_again(fleet: Fleet, plane: Plane, url: str) -> Plane:
    """plane's server started again with its configuration (a new release would be), once stopped."""
    path = _plane_config(fleet, plane.name, plane.host, url)
    return Plane(plane.name, plane.host, fleet.run_server(plane.host, path, f"{plane.name}-new"), plane.token)


def _routing(plane: Plane, leader: str) -> None:
    """Wait until plane is a standby naming leader and its gateway routes to the replica."""
    wait_until(
        lambda: plane.role() == ("standby", leader), WAIT_S, f"{plane.name} to name {leader} the leader"
    )
    wait_until(lambda: plane.ready(MODEL["name"]) or _served(plane), WAIT_S, f"{plane.name} to route")


def test_rolling_both_control_planes_standby_first_then_the_leader_fails_no_request(
    fleet: Fleet, database: str, hosts: tuple[Host, Host]
) -> None:
    """docs/operations.md, Upgrading: each server stopped cleanly (SIGTERM) and started again, the
    standby first, then the leader, which hands over as it stops; clients fail over between gateways."""
    leader, standby, replica, pid, traffic = _steady(fleet, database, hosts, through_both=True)
    try:
        began = time.monotonic()
        standby_code = standby.process.stop(timeout_s=30)
        print(f"\nstandby stopped {time.monotonic() - began:.2f} s into the roll")
        standby = _started_again(fleet, standby, database)
        _routing(standby, leader.name)
        standby_rolled = time.monotonic()
        print(f"standby routing again {standby_rolled - began:.2f} s into the roll")
        leader_code = leader.process.stop(timeout_s=30)
        leader_stopped = time.monotonic()
        wait_until(lambda: standby.role()[0] == "leader", WAIT_S, "the standby to take over", every_s=0.05)
        led = time.monotonic()
        wait_until(lambda: standby.connected("n1"), WAIT_S, "the agent to reach the new leader", every_s=0.05)
        wait_until(lambda: standby.ready(MODEL["name"]), WAIT_S, "the replica to be adopted", every_s=0.05)
        adopted = time.monotonic()
        leader = _started_again(fleet, leader, database)
        _routing(leader, standby.name)
        done = time.monotonic()
        _adopted(fleet, standby, replica, pid)
        _placement_goes_on(standby)
        traffic.wait_for(100, WAIT_S)
    finally:
        traffic.stop()

    during = [s for when, s in traffic.outcomes if began <= when <= done]
    failed = traffic.failed()
    print(
        f"\nroll of two control planes: standby stopped (exit {standby_code}) and routing again after "
        f"{standby_rolled - began:.2f} s; leader stopped (exit {leader_code}) in "
        f"{leader_stopped - standby_rolled:.2f} s, -> standby leads: {led - leader_stopped:.2f} s; "
        f"-> replica adopted: {adopted - leader_stopped:.2f} s; "
        f"old leader routing again as a standby: {done - began:.2f} s after the roll began; "
        f"requests: {len(traffic.outcomes)} at {traffic.rate():.0f}/s ({len(during)} during the roll, "
        f"{traffic.failed_over} answered by the other gateway), failed: {len(failed)}"
    )
    assert (standby_code, leader_code) == (0, 0), "a server did not stop cleanly on SIGTERM"
    for when, gateway, status, body in traffic.failures:
        print(f"failed {when - began:.2f} s into the roll through {gateway}: {status} {body}")
    assert failed == [], f"{len(failed)} requests failed during the roll: {failed[:10]}"
