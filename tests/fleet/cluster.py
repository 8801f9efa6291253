"""A fleet of `llmgw` processes on namespace hosts: a control plane, nodes and a mirror.

Each role runs as a real `llmgw` process inside its host's namespace, with a
configuration file written here and certificates issued by the project's own
`llmgw cert` commands: the server's names the control plane's address, each
node's carries its node id as common name. Intervals are short so that a silent
node leaves, and a replacement starts, within seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from ruamel.yaml import YAML

from .netns import Host, Network, Process, wait_until

GATEWAY_PORT = 8080
AGENT_PORT = 7443
MIRROR_PORT = 8081
# The engines a node could install: none may be downloaded inside a namespace with no way out.
_NOT_HERE = ["llamacpp", "vllm", "sglang"]


def llmgw_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmgw", *args]


def _env() -> dict[str, str]:
    # PYTHONPATH passes through: the llmgw run is the one under test, not an installed one.
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def llmgw_command(*args: str) -> str:
    """`llmgw ARGS` run here (no network needed) to the end; its stdout."""
    done = subprocess.run(
        llmgw_argv(*args), capture_output=True, text=True, env=_env(), timeout=60, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"llmgw {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done.stdout


@attrs.frozen
class Certificates:
    """A certificate authority made with `llmgw cert init-ca`, and what it issued."""

    dir: Path

    @classmethod
    def create(cls, directory: Path) -> Certificates:
        llmgw_command("cert", "init-ca", "--dir", str(directory))
        return cls(directory)

    def server(self, name: str, hosts: Sequence[str]) -> tuple[Path, Path]:
        if not (self.dir / f"{name}.pem").exists():
            llmgw_command(
                "cert", "issue-server", name, *[f"--host={h}" for h in hosts], "--dir", str(self.dir)
            )
        return self.dir / f"{name}.pem", self.dir / f"{name}-key.pem"

    def agent(self, node: str) -> tuple[Path, Path]:
        if not (self.dir / f"{node}.pem").exists():
            llmgw_command("cert", "issue-agent", node, "--dir", str(self.dir))
        return self.dir / f"{node}.pem", self.dir / f"{node}-key.pem"

    def tls(self, cert: tuple[Path, Path]) -> dict[str, str]:
        return {"ca": str(self.dir / "ca.pem"), "cert": str(cert[0]), "key": str(cert[1])}


def _write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        YAML().dump(dict(data), f)
    return path


def log_events(process: Process) -> list[dict[str, Any]]:
    """The JSON log lines of an llmgw process (--log-format=json); other lines are left out."""
    events = []
    for line in process.output().splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


@attrs.define
class Reply:
    status: int
    headers: dict[str, str]
    body: Any


def http(
    method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0
) -> Reply:
    """One HTTP exchange; run it through Host.call to make it from that host. Status 0: no answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            raw = reply.read()
            status, got = reply.status, dict(reply.headers)
    except urllib.error.HTTPError as err:
        raw, status, got = err.read(), err.code, dict(err.headers)
    except (urllib.error.URLError, OSError):
        return Reply(0, {}, None)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")
    return Reply(status, got, parsed)


# An InfiniBand HCA with a port up, as the agent's fabric discovery reads it, on a tmpfs that
# only this process tree sees (`ip netns exec` gives each command its own mount namespace and /sys).
_FAKE_HCA = (
    "mount -t tmpfs fake-hca /sys/class"
    " && mkdir -p /sys/class/infiniband/mlx5_0/ports/1"
    " && echo '4: ACTIVE' > /sys/class/infiniband/mlx5_0/ports/1/state"
    ' && exec "$@"'
)


def _run_role(
    host: Host,
    role: str,
    config: Path,
    log: Path,
    fake_hca: bool = False,
    env: Mapping[str, str] | None = None,
) -> Process:
    """`llmgw --role=ROLE --config CONFIG` inside host, its JSON log lines in log; env added to its own."""
    argv = llmgw_argv("--log-format=json", f"--role={role}", "--config", str(config))
    if os.environ.get("LLMGW_TEST_LOOP") == "uvloop":
        # The fleet's processes on uvloop too, as the tests' own loops (tests/conftest.py).
        argv += ["--loop", "uvloop"]
    if fake_hca:
        argv = ["sh", "-c", _FAKE_HCA, "sh", *argv]
    return host.run(argv, log=log, env={**_env(), **(env or {})}, name=role)


class Fleet:
    """The llmgw processes of one test on a Network's hosts; stop() ends them all."""

    def __init__(self, network: Network, certificates: Certificates, workdir: Path) -> None:
        self.network = network
        self.certificates = certificates
        self.workdir = workdir
        self.cp = network.hosts["cp"]
        self.admin_token = secrets.token_urlsafe(24)
        self.key = ""
        self.server: Process | None = None
        self.agents: dict[str, Process] = {}

    @property
    def gateway(self) -> str:
        return f"http://{self.cp.address}:{GATEWAY_PORT}"

    # --- roles ------------------------------------------------------------------------

    def server_config(
        self,
        models: Sequence[Mapping[str, Any]],
        host: Host | None = None,
        name: str = "server",
        **overrides: Any,
    ) -> Path:
        """server.yaml for a server on host (default cp) whose certificate names its address.

        name: the file, state directory and certificate of its own, for several servers at once.
        """
        host = host or self.cp
        cert = self.certificates.server(name, [host.address])
        data: dict[str, Any] = {
            "listen": f"{host.address}:{GATEWAY_PORT}",
            # Every address of the host, so a node dialling one the certificate does not name
            # reaches the handshake and can be told so.
            "agent_listen": f"0.0.0.0:{AGENT_PORT}",
            "state_dir": str(self.workdir / name),
            "admin_tokens": [hashlib.sha256(self.admin_token.encode()).hexdigest()],
            "tls": self.certificates.tls(cert),
            "control": {"interval_s": 0.5, "grace_s": 3.0, "base_backoff_s": 1.0},
            "engines": {"llamacpp": ""},
            "models": [dict(m) for m in models],
            **overrides,
        }
        return _write_yaml(self.workdir / f"{name}.yaml", data)

    def start_server(
        self, models: Sequence[Mapping[str, Any]], env: Mapping[str, str] | None = None, **overrides: Any
    ) -> Process:
        """The server role on cp, with an API key made beforehand; returns once /health answers.

        env: added to the server's environment (the variable an endpoint's `api_key_env` names).
        """
        path = self.server_config(models, **overrides)
        if not self.key:
            self.key = llmgw_command("keys", "create", "fleet", "--config", str(path)).strip()
        self.server = self.run_server(self.cp, path, env=env)
        return self.server

    def run_server(
        self, host: Host, path: Path, name: str = "server", env: Mapping[str, str] | None = None
    ) -> Process:
        """The server role on host with the configuration at path; returns once its /health answers."""
        server = _run_role(host, "server", path, self.workdir / "logs" / f"{name}.log", env=env)
        health = f"http://{host.address}:{GATEWAY_PORT}/health"
        wait_until(
            lambda: host.call(http, "GET", health).status == 200 or not server.alive(),
            60,
            "the gateway to answer /health",
        )
        assert server.alive(), f"the server exited:\n{server.output()}"
        return server

    def agent_config(self, host: Host, servers: Sequence[str] | None = None, **overrides: Any) -> Path:
        cert = self.certificates.agent(host.name)
        data: dict[str, Any] = {
            "node_id": host.name,
            "servers": list(servers) if servers is not None else [f"{self.cp.address}:{AGENT_PORT}"],
            "state_dir": str(self.workdir / host.name),
            "heartbeat_interval_s": 0.5,
            "ready_timeout_s": 60.0,
            "tls": self.certificates.tls(cert),
            "engines": {"disabled": _NOT_HERE},
            "keep_engines_on_stop": True,
            **overrides,
        }
        return _write_yaml(self.workdir / f"{host.name}.yaml", data)

    def start_agent(
        self, host: Host, servers: Sequence[str] | None = None, fake_hca: bool = False, **overrides: Any
    ) -> Process:
        """The agent role on host, node id = host name; returns at once (see wait_connected).

        fake_hca: the agent sees an InfiniBand HCA with a port up, so that a `fabric`
        in overrides is reported and the node can host part of a multi-node replica.
        """
        path = self.agent_config(host, servers, **overrides)
        process = _run_role(host, "agent", path, self.workdir / "logs" / f"{host.name}.log", fake_hca)
        self.agents[host.name] = process
        return process

    def restart_agent(self, host: Host) -> Process:
        """Start host's agent again with the configuration it had; its log is a file of its own."""
        path = self.workdir / f"{host.name}.yaml"
        runs = len([p for p in host.processes if p.name.endswith("agent")])
        process = _run_role(host, "agent", path, self.workdir / "logs" / f"{host.name}-{runs + 1}.log")
        self.agents[host.name] = process
        return process

    def start_mirror(self, host: Host, root: Path) -> Process:
        path = _write_yaml(
            self.workdir / "mirror.yaml", {"listen": f"{host.address}:{MIRROR_PORT}", "root": str(root)}
        )
        process = _run_role(host, "mirror", path, self.workdir / "logs" / "mirror.log")
        url = f"http://{host.address}:{MIRROR_PORT}/health"
        wait_until(
            lambda: host.call(http, "GET", url).status == 200 or not process.alive(),
            60,
            "the mirror to answer",
        )
        assert process.alive(), f"the mirror exited:\n{process.output()}"
        return process

    # --- what the control plane says, asked from its own host ---------------------------

    def add_model(self, model: Mapping[str, Any]) -> None:
        """Add model to the live catalog (as `llmgw ctl model add` does); placed over the nodes there now."""
        reply = self.cp.call(
            http,
            "POST",
            f"{self.gateway}/admin/api/v1/models",
            dict(model),
            {"Authorization": f"Bearer {self.admin_token}"},
        )
        assert reply.status in (200, 201), f"adding {model['name']}: {reply.status} {reply.body}"

    def start(
        self,
        nodes: Sequence[str],
        models: Sequence[Mapping[str, Any]],
        server: Mapping[str, Any] | None = None,
        **agent: Any,
    ) -> list[dict[str, Any]]:
        """A server, an agent on each of nodes, and models added once all are connected.

        Added only then, so that placement spreads them over every node rather than
        over whichever connected first. The ready replicas of the first model.
        """
        self.start_server([], **(server or {}))
        for name in nodes:
            self.start_agent(self.network.hosts[name], **agent)
        self.wait_connected(*nodes)
        for model in models:
            self.add_model(model)
        return self.wait_ready(models[0]["name"], int(models[0]["replicas"]))

    def admin(self, path: str) -> Any:
        reply = self.cp.call(
            http,
            "GET",
            f"{self.gateway}/admin/api/v1/{path}",
            headers={"Authorization": f"Bearer {self.admin_token}"},
        )
        assert reply.status == 200, f"admin API {path}: {reply.status} {reply.body}"
        return reply.body

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["id"]: n for n in self.admin("nodes")}

    def replicas(self, model: str | None = None) -> list[dict[str, Any]]:
        return list(self.admin("replicas" + (f"?model={model}" if model else "")))

    def routed(self, model: str) -> int:
        """How many of model's replicas the gateway routes to now."""
        return int(next(m for m in self.admin("models") if m["name"] == model)["ready"])

    def wait_connected(self, *nodes: str, timeout_s: float = 60) -> None:
        def connected() -> bool:
            known = self.nodes()
            return all(n in known and known[n]["reachable"] for n in nodes)

        wait_until(connected, timeout_s, f"nodes {', '.join(nodes)} to connect", every_s=0.3)

    def wait_ready(self, model: str, count: int, timeout_s: float = 90) -> list[dict[str, Any]]:
        """model's replicas once count of them are routed to."""
        wait_until(
            lambda: self.routed(model) >= count, timeout_s, f"{count} ready replicas of {model}", every_s=0.3
        )
        return [r for r in self.replicas(model) if r["state"] == "ready"]

    def chat(self, model: str, timeout_s: float = 10.0) -> Reply:
        """One non-streamed chat completion through the gateway, sent from cp."""
        return self.cp.call(
            http,
            "POST",
            f"{self.gateway}/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            {"Authorization": f"Bearer {self.key}"},
            timeout_s,
        )

    def processes(self) -> list[Process]:
        return [p for host in self.network.hosts.values() for p in host.processes]

    def stop(self) -> None:
        for host in reversed(list(self.network.hosts.values())):
            host.stop_processes()
