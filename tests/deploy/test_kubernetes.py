"""The chart as `helm template` renders it, run with `podman kube play`: a chat through the server pod."""

from __future__ import annotations

import base64
import copy
import functools
import io
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from llmgw.cli.cert import cert
from tests.postgres import running_cluster

from .chart import REPO, find, template
from .podman import Podman, first_chat, http, wait_until

NODE = "node-1"
VALUES = Path(__file__).with_name("podman-values.yaml")
PODMAN_KUBE = REPO / "scripts" / "podman_kube.py"
SERVER = "llmgw-server-pod-0-server"


def _load(text: str) -> list[dict[str, Any]]:
    return [doc for doc in YAML(typ="safe").load_all(text) if doc]


def _secrets(ca_dir: Path, servers: tuple[str, ...] = ("llmgw-server",)) -> tuple[list[dict[str, Any]], str]:
    """The Secrets `llmgw cert kubernetes-secrets --admin-token` writes, and the admin token.

    The server's certificate carries the names of the servers' pods, which agents dial here.
    """
    runner = CliRunner()
    done = runner.invoke(cert, ["init-ca", "--dir", str(ca_dir)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    args = ["kubernetes-secrets", "--dir", str(ca_dir), "--node", NODE, "--admin-token"]
    args += [arg for server in servers for arg in ("--host", f"{server}-pod-0")]
    done = runner.invoke(cert, args, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return _load(done.stdout), (ca_dir / "kubernetes-admin-token").read_text().strip()


def _free_port(taken: tuple[int, ...] = ()) -> int:
    """A port free on 127.0.0.1 now, and not one of taken (which may be free until kube play binds it)."""
    # kube play publishes a hostPort it is given, not one it chooses.
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def _edit_config(doc: dict[str, Any], key: str, **changes: Any) -> None:
    data = YAML(typ="safe").load(doc["data"][key])
    data.update(changes)
    out = io.StringIO()
    YAML(typ="safe").dump(data, out)
    doc["data"][key] = out.getvalue()


def _podman_kube(*args: str) -> str:
    """scripts/podman_kube.py, as docs/kubernetes.md has a user run it; what it printed."""
    done = subprocess.run(
        [sys.executable, str(PODMAN_KUBE), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _dump(docs: list[dict[str, Any]], path: Path) -> Path:
    with path.open("w") as f:
        YAML(typ="safe").dump_all(docs, f)
    return path


def _play(
    podman: Podman, image: str, tmp_path: Path, values: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    """`podman kube play` of the chart rendered with the podman values (and the Secrets).

    The gateway's port on 127.0.0.1, what was played, and the admin token.
    """
    secrets_, admin_token = _secrets(tmp_path / "pki")
    port, played = _play_rendered(podman, image, tmp_path, secrets_, values or {})
    return port, played, admin_token


def _play_rendered(
    podman: Podman,
    image: str,
    tmp_path: Path,
    secrets_: list[dict[str, Any]],
    values: dict[str, str],
    then: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] = lambda docs: docs,
    taken: tuple[int, ...] = (),
) -> tuple[int, list[dict[str, Any]]]:
    """`helm template`, scripts/podman_kube.py and the up.sh it writes, as docs/kubernetes.md runs them.

    then: a change to what the script made (a second server), before it is played.
    """
    repository, tag = image.rsplit(":", 1)
    docs = template({"image.repository": repository, "image.tag": tag, **values}, files=[VALUES])
    port = _free_port(taken)
    out = tmp_path / "play"
    said = _podman_kube(
        str(_dump(docs, tmp_path / "rendered.yaml")), str(_dump(secrets_, tmp_path / "secrets.yaml")),
        "--out", str(out), "--node", NODE, "--host-dir", str(tmp_path), "--gateway-port", str(port),
        "--network", podman.network, "--label", f"llmgw-test={podman.label}",
    )  # fmt: skip
    # The monitors render (the operator's API is given to helm), and kube play would not run them.
    assert "left out ServiceMonitor llmgw: kube play does not run it" in said
    played = then([d for d in YAML(typ="safe").load_all((out / "play.yaml").read_text()) if d])
    _dump(played, out / "play.yaml")
    # Whatever happens next, the fixture removes them.
    podman.secrets += [d["metadata"]["name"] for d in secrets_]
    podman.volumes += [
        d["metadata"]["name"] for d in played if d["kind"] in ("ConfigMap", "PersistentVolumeClaim")
    ]
    podman.volumes += [d["metadata"]["name"] for d in secrets_]
    done = subprocess.run(
        ["sh", str(out / "up.sh")], env=podman.env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"up.sh exited {done.returncode}: {done.stderr}"
    return port, played


def _probes(docs: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(container, URL inside it) of every liveness and readiness probe, its named port resolved."""
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for kind in ("livenessProbe", "readinessProbe"):
                get = container[kind]["httpGet"]
                port = ports.get(get["port"], get["port"])
                yield (
                    f"{doc['metadata']['name']}-pod-0-{container['name']}",
                    f"http://127.0.0.1:{port}{get['path']}",
                )


def _status_inside(podman: Podman, container: str, url: str) -> str:
    """The HTTP status of url asked from inside container (the image's own Python), or why none."""
    ask = (
        "import sys, urllib.request\n"
        "try: print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
        "except Exception as err: print(err)"
    )
    return podman("exec", container, "/opt/llmgw/bin/python", "-c", ask, url, check=False).strip()


def _exec(podman: Podman, container: str, *args: str) -> str:
    """What args print in container; failing with its logs when it is not running."""
    done = podman("exec", container, *args, check=False)
    state = podman("inspect", "--format", "{{.State.Running}}", container, check=False).strip()
    assert state == "true", f"{container} exited:\n{podman.logs(container)[-3000:]}"
    return done


# The image fixture builds the image when this test is the session's first to need it.
@pytest.mark.slow
@pytest.mark.timeout(900)
class TestPodmanKubePlay:
    def test_the_charts_server_and_agent_serve_a_chat_and_its_probes_answer(
        self, podman: Podman, image: str, tmp_path: Path
    ) -> None:
        """The Secrets `llmgw cert kubernetes-secrets` writes, then what `helm template` renders."""
        started = time.monotonic()
        port, played, admin_token = _play(podman, image, tmp_path)
        # As docs/kubernetes.md has them run with kubectl exec: server.yaml where they look unasked.
        key = _exec(podman, SERVER, "llmgw", "keys", "create", "first").strip()
        gateway = f"http://127.0.0.1:{port}"
        body = first_chat(podman, gateway, key, [SERVER, "llmgw-agent-pod-0-agent"])
        print(f"\nkube play to first answered chat: {time.monotonic() - started:.1f} s")
        assert body["choices"][0]["message"]["content"]
        assert NODE in podman("exec", SERVER, "llmgw", "ctl", "nodes")
        # The admin token from its Secret: the admin API answers it from outside the pod.
        status, nodes = http(
            "GET", f"{gateway}/admin/api/v1/nodes", None, {"Authorization": f"Bearer {admin_token}"}
        )
        assert status == 200, nodes
        # kube play makes the probes systemd timers, which this machine lacks: each is asked here.
        for container, url in _probes(played):
            answered = functools.partial(lambda c, u: _status_inside(podman, c, u) == "200", container, url)
            wait_until(answered, 60, f"{url} to answer in {container}")
        # The mirror's pod by its name, standing in for its Service.
        assert _status_inside(podman, SERVER, "http://llmgw-mirror-pod-0:8081/health") == "200"

        # down.sh: every pod, volume (the store's claim among them) and secret up.sh made is gone.
        secrets_ = podman.secrets
        done = subprocess.run(
            ["sh", str(tmp_path / "play" / "down.sh")], env=podman.env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert podman("pod", "ps", "-q", "--filter", f"label=llmgw-test={podman.label}").strip() == ""
        left = set(podman("volume", "ls", "--format", "{{.Name}}").split())
        assert left & set(podman.volumes) == set()
        assert set(podman("secret", "ls", "--format", "{{.Name}}").split()) & set(secrets_) == set()


# The podman network of the PostgreSQL test: the servers' pods reach the cluster on its
# gateway's address, which the throwaway cluster's pg_hba.conf trusts (198.18.0.0/15).
PG_SUBNET = "198.19.251.0/24"
PG_GATEWAY = "198.19.251.1"
SERVER_B = "llmgw-server-b"


def _a_second_server(port: int) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """kube play makes one pod of a Deployment of two: the second server is a copy by another name.

    Its gateway on port; the agent lists both pods, as a cluster's agent lists the one Service.
    """

    def add(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        server = find(docs, "Deployment", "llmgw-server")
        # kube play starts the one pod as many times, each binding the same host port.
        server["spec"]["replicas"] = 1
        second = copy.deepcopy(server)
        second["metadata"]["name"] = SERVER_B
        # Only the gateway's port: kube play publishes the others on the host too, where the
        # first server holds them already.
        container = second["spec"]["template"]["spec"]["containers"][0]
        container["ports"] = [{**p, "hostPort": port} for p in container["ports"] if p["name"] == "gateway"]
        agent = find(docs, "ConfigMap", "llmgw-agent")
        _edit_config(agent, "agent.yaml", servers=["llmgw-server-pod-0:7443", f"{SERVER_B}-pod-0:7443"])
        return [*docs, second]

    return add


def _leads(podman: Podman, container: str) -> bool:
    return ", the leader" in podman("exec", container, "llmgw", "ctl", "status", check=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
class TestPodmanKubePlayOnPostgreSQL:
    def test_two_servers_on_postgresql_serve_a_chat_and_the_standby_takes_over_when_the_leader_goes(
        self, podman: Podman, image: str, tmp_path: Path
    ) -> None:
        """The chart's PostgreSQL values: the URL from its Secret, two servers, one leading."""
        # A network of a subnet the test names, in place of the fixture's.
        podman("network", "rm", "-f", podman.network)
        podman.network += "-pg"
        podman("network", "create", "--subnet", PG_SUBNET, "--gateway", PG_GATEWAY, podman.network)
        # Every address: the network's gateway address exists only once its first pod starts.
        with running_cluster(listen=("0.0.0.0",)) as cluster:
            url = cluster.fresh_database().replace("@0.0.0.0:", f"@{PG_GATEWAY}:")
            secrets_, _ = _secrets(tmp_path / "pki", ("llmgw-server", SERVER_B))
            secrets_.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "llmgw-postgres"},
                    "data": {"url": base64.b64encode(url.encode()).decode()},
                }
            )
            values = {
                "database.type": "postgresql",
                "server.replicas": "2",
                "database.url.secretName": "llmgw-postgres",
            }
            port_b = _free_port()
            port, _ = _play_rendered(
                podman, image, tmp_path, secrets_, values, _a_second_server(port_b), (port_b,)
            )
            servers = [SERVER, f"{SERVER_B}-pod-0-server"]
            key = _exec(podman, SERVER, "llmgw", "keys", "create", "first").strip()
            agent = "llmgw-agent-pod-0-agent"
            first_chat(podman, f"http://127.0.0.1:{port}", key, [*servers, agent])
            # The other server's gateway serves too, from the same store and routing table.
            first_chat(podman, f"http://127.0.0.1:{port_b}", key, [*servers, agent])
            leader = wait_until(lambda: next((s for s in servers if _leads(podman, s)), None), 30, "a leader")
            standby = next(s for s in servers if s != leader)
            gateway = f"http://127.0.0.1:{port if standby == SERVER else port_b}"

            podman("pod", "rm", "-f", "-t", "0", leader.removesuffix("-server"))
            wait_until(lambda: _leads(podman, standby), 60, f"{standby} to take the leadership")
            wait_until(
                lambda: NODE in podman("exec", standby, "llmgw", "ctl", "nodes", check=False),
                60,
                f"the agent to register with {standby}",
            )
            first_chat(podman, gateway, key, [standby, agent])
