"""Two control planes on one PostgreSQL, one agent with a sim replica: the leader is SIGKILLed under traffic.

Two `llmgw --role=server` processes share a throwaway PostgreSQL database; one
`llmgw --role=agent` lists both. Clients send steady traffic (about 50 requests a
second) through the standby's gateway while the leader is killed outright. No
request may fail; the standby takes over, the agent reconnects to it, its running
engine is adopted (the same process, no second one), and placement goes on.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest

from llmgw import bound, config, pki
from llmgw.agent import state as engine_state
from llmgw.config import AgentConfig, AuthConfig, ControlConfig, ModelConfig, ProfileConfig, TLSConfig

from ..servers import loopback_server_config

pytestmark = pytest.mark.slow

MODEL = "sim-chat"
ADDED = "sim-added"
WAIT_S = 90.0
# Clients and the pause each takes between requests: about 50 requests a second in all.
CLIENTS = 4
PAUSE_S = 0.06
_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 4}


@attrs.define
class Server:
    name: str
    process: subprocess.Popen[bytes]
    listening: bound.Listening

    @property
    def gateway(self) -> str:
        return f"http://{self.listening.gateway}"

    @property
    def admin(self) -> str:
        return f"http://{self.listening.admin}"


def _until(predicate: Any, within_s: float, what: str) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


def _llmgw(role: str, path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "llmgw", f"--role={role}", "--config", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )


@contextlib.contextmanager
def _servers(tmp_path: Path, url: str) -> Iterator[tuple[list[Server], Path]]:
    base = loopback_server_config(
        tmp_path,
        database=url,
        auth=AuthConfig(enabled=False),
        models=[ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])],
        # Nothing to install: the sim ships inside llmgw.
        engines={"llamacpp": ""},
        control=ControlConfig(interval_s=0.2, grace_s=10.0),
    )
    processes: list[subprocess.Popen[bytes]] = []
    servers = []
    try:
        for name in ("cp1", "cp2"):
            state = tmp_path / name
            cfg = config.evolve(base, state_dir=str(state), control=config.evolve(base.control, name=name))
            path = tmp_path / f"{name}.yaml"
            path.write_text(config.dump(cfg))
            processes.append(_llmgw("server", path, tmp_path / f"{name}.log"))
            listening = _until(lambda state=state: bound.read(state), WAIT_S, f"{name} to listen")
            servers.append(Server(name, processes[-1], listening))
        yield servers, tmp_path / "pki"
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()


def _role(server: Server) -> tuple[str, str]:
    """(leader or standby, the leader's name) as the server's /api/v1/status says."""
    status = _get(f"{server.admin}/api/v1/status")
    plane = (status or {}).get("control_plane") or {}
    return plane.get("role", ""), plane.get("leader", "")


def _replicas(server: Server, model: str = MODEL) -> list[dict[str, Any]]:
    replicas = _get(f"{server.admin}/api/v1/replicas") or []
    return [r for r in replicas if r["model"] == model]


def _node_connected(server: Server) -> bool:
    nodes = _get(f"{server.admin}/api/v1/nodes") or []
    return any(n["id"] == "n1" and n["state"] not in ("disconnected", "unreachable") for n in nodes)


def _traffic(url: str, stop: threading.Event, outcomes: list[tuple[float, int]]) -> None:
    """Post chat completions until stop; record (when, status) of each, 0 for no answer at all."""
    where = urlsplit(url)
    data = json.dumps(_BODY).encode()
    while not stop.is_set():
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        status = 0
        try:
            connection.request("POST", "/v1/chat/completions", data, {"Content-Type": "application/json"})
            reply = connection.getresponse()
            body = reply.read()
            status = reply.status if b'"choices"' in body else -reply.status
        except (OSError, http.client.HTTPException):
            status = 0
        finally:
            connection.close()
        outcomes.append((time.monotonic(), status))
        time.sleep(PAUSE_S)


def test_killing_the_leader_under_traffic_through_the_standby_fails_no_request_and_adopts_the_replica(
    tmp_path: Path, postgres_url: str
) -> None:
    stop = threading.Event()
    outcomes: list[tuple[float, int]] = []
    clients: list[threading.Thread] = []
    agent_state = tmp_path / "agent"
    agent: subprocess.Popen[bytes] | None = None
    try:
        with _servers(tmp_path, postgres_url) as (servers, pki_dir):
            by_name = {s.name: s for s in servers}
            leader_name = _until(lambda: _role(servers[1])[1], WAIT_S, "a leader")
            leader = by_name[leader_name]
            (standby,) = [s for s in servers if s is not leader]
            assert _role(leader)[0] == "leader" and _role(standby) == ("standby", leader.name)

            cert, key = pki.issue_agent(pki_dir, "n1", tmp_path / "agent-pki")
            # The standby first: the agent must find the leader whatever the order.
            agent_cfg = AgentConfig(
                node_id="n1",
                servers=[f"127.0.0.1:{s.listening.agent_port}" for s in (standby, leader)],
                state_dir=str(agent_state),
                tls=TLSConfig(ca=str(pki_dir / "ca.pem"), cert=str(cert), key=str(key)),
                heartbeat_interval_s=0.5,
            )
            path = tmp_path / "agent.yaml"
            path.write_text(config.dump(agent_cfg))
            agent = _llmgw("agent", path, tmp_path / "agent.log")

            (before,) = _until(
                lambda: [r for r in _replicas(leader) if r["state"] == "ready"] or None, WAIT_S, "a replica"
            )
            (engine,) = engine_state.read_state(agent_state)
            # The standby serves it too, from the table the leader published.
            _until(lambda: _post(standby.gateway) == 200, WAIT_S, "the standby's gateway to serve")

            for _ in range(CLIENTS):
                client = threading.Thread(
                    target=_traffic, args=(standby.gateway, stop, outcomes), daemon=True
                )
                client.start()
                clients.append(client)
            _until(lambda: len(outcomes) >= 100, WAIT_S, "steady traffic")

            killed = time.monotonic()
            leader.process.send_signal(signal.SIGKILL)
            leader.process.wait()
            _until(lambda: _role(standby)[0] == "leader", WAIT_S, "the standby to take over")
            led = time.monotonic()
            _until(lambda: _node_connected(standby), WAIT_S, "the agent to reach the new leader")
            connected = time.monotonic()
            (after,) = _until(
                lambda: [r for r in _replicas(standby) if r["state"] == "ready"] or None,
                WAIT_S,
                "the replica to be adopted",
            )
            adopted = time.monotonic()

            # Placement goes on under the new leader.
            added = json.dumps({"name": ADDED, "replicas": 1, "profiles": [{"engine": "sim"}]}).encode()
            request = urllib.request.Request(
                f"{standby.admin}/api/v1/models", data=added, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 201
            _until(
                lambda: [r for r in _replicas(standby, ADDED) if r["state"] == "ready"] or None,
                WAIT_S,
                "the added model to be placed",
            )
            # A few more seconds of traffic under the new leader, then the count.
            settled = len(outcomes)
            _until(lambda: len(outcomes) >= settled + 100, WAIT_S, "traffic after the takeover")
            stop.set()
            for client in clients:
                client.join(timeout=60)

            during = [status for when, status in outcomes if killed <= when <= adopted + 1]
            rate = len(outcomes) / (outcomes[-1][0] - outcomes[0][0])
            failed = [status for _, status in outcomes if status != 200]
            print(
                f"\nleader killed -> standby leads: {led - killed:.2f} s; -> agent connected: "
                f"{connected - killed:.2f} s; -> replica adopted: {adopted - killed:.2f} s; "
                f"requests: {len(outcomes)} at {rate:.0f}/s ({len(during)} during the takeover), "
                f"failed: {len(failed)}"
            )
            assert failed == [], f"{len(failed)} requests failed through the standby's gateway: {failed[:10]}"
            # Adopted: the same shard, the same engine process; no second replica of the model.
            assert after["shard_id"] == before["shard_id"]
            assert [r["shard_id"] for r in _replicas(standby)] == [before["shard_id"]]
            records = {r.request.shard_id: r.pid for r in engine_state.read_state(agent_state)}
            assert records[before["shard_id"]] == engine.pid
            assert len(records) == 2
    finally:
        stop.set()
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGKILL)
            agent.wait()
        # Engines outlive a killed agent: its state file says which to end.
        for record in engine_state.read_state(agent_state):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)


def _post(gateway: str) -> int:
    where = urlsplit(gateway)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(_BODY).encode(), {"Content-Type": "application/json"}
        )
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        connection.close()
