"""The chart as `helm template` renders it, run with `podman kube play`: a chat through the server pod."""

from __future__ import annotations

import base64
import copy
import functools
import io
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from llmgw.cli.cert import cert
from llmgw.kube_secrets import AGENT_SECRET, SERVER_SECRET

from .chart import template
from .podman import Podman, first_chat, http, wait_until

NODE = "node-1"
VALUES = Path(__file__).with_name("podman-values.yaml")
SERVER = "llmgw-server-pod-0-server"


def _load(text: str) -> list[dict[str, Any]]:
    return [doc for doc in YAML(typ="safe").load_all(text) if doc]


def _secrets(ca_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """The Secrets `llmgw cert kubernetes-secrets --admin-token` writes, and the admin token."""
    runner = CliRunner()
    done = runner.invoke(cert, ["init-ca", "--dir", str(ca_dir)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    args = ["kubernetes-secrets", "--dir", str(ca_dir), "--node", NODE, "--host", "llmgw-server-pod-0"]
    done = runner.invoke(cert, [*args, "--admin-token"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return _load(done.stdout), (ca_dir / "kubernetes-admin-token").read_text().strip()


def _free_port() -> int:
    # kube play publishes a hostPort it is given, not one it chooses.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _edit_config(doc: dict[str, Any], key: str, **changes: Any) -> None:
    data = YAML(typ="safe").load(doc["data"][key])
    data.update(changes)
    out = io.StringIO()
    YAML(typ="safe").dump(data, out)
    doc["data"][key] = out.getvalue()


def for_podman(docs: list[dict[str, Any]], label: str, tmp: Path, port: int) -> list[dict[str, Any]]:
    """What the chart renders, as `podman kube play` (4.3) can run it: each change a cluster's stand-in.

    The one step docs/kubernetes.md names. kube play has no Services (the agent dials the
    server's pod by its name), no DaemonSets (the agent's becomes a Deployment of one, on a
    "node" named node-1), no GPU runtime, and no downward API for spec.nodeName; a hostPort
    stands in for the gateway's Service. Everything else (probes, volumes, security contexts,
    the start commands, the Secrets read into the environment) runs as rendered.
    """
    out = []
    for doc in copy.deepcopy(docs):
        doc["metadata"].pop("namespace", None)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "llmgw-agent":
            _edit_config(doc, "agent.yaml", servers=["llmgw-server-pod-0:7443"])
        if doc["kind"] == "DaemonSet":
            spec = doc["spec"]
            doc["kind"] = "Deployment"
            doc["spec"] = {"replicas": 1, "selector": spec["selector"], "template": spec["template"]}
            pod = spec["template"]["spec"]
            for key in ("runtimeClassName", "nodeSelector", "tolerations"):
                pod.pop(key)
            pod["containers"][0]["env"] = [{"name": "NODE_NAME", "value": NODE}]
            for volume in pod["volumes"]:
                if "hostPath" in volume:
                    volume["hostPath"]["path"] = str(tmp / volume["name"])
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            template["metadata"]["labels"]["llmgw-test"] = label
            for container in template["spec"]["containers"]:
                for p in container.get("ports", []):
                    if p["name"] == "gateway":
                        p.update(hostPort=port, hostIP="127.0.0.1")
        out.append(doc)
    return out


def _create_secret(podman: Podman, doc: dict[str, Any], path: Path) -> None:
    """A Secret as podman 4.3's kube play reads it: a podman secret, in one of two shapes.

    A Secret mounted as a volume (the certificates) is the manifest, each `data` value
    decoded, since kube play writes it into the volume without decoding the base64. One
    read into the environment (the admin token's) is only its `data`, a JSON map of base64
    values: kube play reads that one so, and refuses the manifest ("not valid JSON").
    """
    if doc["metadata"]["name"] in (SERVER_SECRET, AGENT_SECRET):
        plain = copy.deepcopy(doc)
        plain["data"] = {k: base64.b64decode(v).decode() for k, v in doc["data"].items()}
        path.write_text(json.dumps(plain))
    else:
        path.write_text(json.dumps(doc["data"]))
    name = doc["metadata"]["name"]
    podman("secret", "create", name, str(path))
    podman.secrets.append(name)


def _play(podman: Podman, image: str, tmp_path: Path) -> tuple[int, list[dict[str, Any]], str]:
    """`podman kube play` of the chart rendered with the podman values (and the Secrets).

    The gateway's port on 127.0.0.1, what was played, and the admin token.
    """
    secrets_, admin_token = _secrets(tmp_path / "pki")
    for doc in secrets_:
        _create_secret(podman, doc, tmp_path / f"{doc['metadata']['name']}.json")
    repository, tag = image.rsplit(":", 1)
    docs = template({"image.repository": repository, "image.tag": tag}, files=[VALUES])
    docs = [d for d in docs if d["kind"] not in ("ServiceMonitor", "PodMonitor")]
    podman.volumes += [
        d["metadata"]["name"] for d in docs if d["kind"] in ("ConfigMap", "PersistentVolumeClaim")
    ]
    podman.volumes += [d["metadata"]["name"] for d in secrets_]
    port = _free_port()
    played = for_podman(docs, podman.label, tmp_path, port)
    play = tmp_path / "play.yaml"
    with play.open("w") as f:
        YAML(typ="safe").dump_all(played, f)
    podman("kube", "play", "--network", podman.network, str(play), timeout_s=300)
    return port, played, admin_token


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
