"""deploy/kubernetes: valid for the Kubernetes versions still supported, and run with `podman kube play`."""

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

import kubernetes_validate
import pytest
from click.testing import CliRunner
from kubernetes_validate import utils as kv_utils
from ruamel.yaml import YAML

from llmgw.cli.cert import cert

from .podman import SIM_MODEL, Podman, first_chat, wait_until

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
# Kinds the Prometheus operator's CRDs add: kubernetes-validate has no schema for them.
_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}
NODE = "node-1"


def _supported_versions() -> list[str]:
    """The three newest minor releases kubernetes-validate knows: what upstream still supports."""
    versions = sorted(set(kv_utils.all_versions()), key=lambda v: tuple(int(p) for p in v.split(".")))
    return versions[-3:]


def _load(text: str) -> list[dict[str, Any]]:
    return [doc for doc in YAML(typ="safe").load_all(text) if doc]


def _documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in _load(path.read_text()):
            yield path.name, doc


def _kind(kind: str, name: str) -> dict[str, Any]:
    return next(doc for _, doc in _documents() if doc["kind"] == kind and doc["metadata"]["name"] == name)


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, doc in _documents():
        if doc["kind"] in ("Deployment", "DaemonSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def _secrets(ca_dir: Path, *args: str) -> str:
    runner = CliRunner()
    done = runner.invoke(cert, ["init-ca", "--dir", str(ca_dir)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    done = runner.invoke(cert, ["kubernetes-secrets", "--dir", str(ca_dir), *args], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.stdout


class TestTheManifests:
    @pytest.mark.parametrize("version", _supported_versions())
    def test_every_manifest_is_valid_for_each_kubernetes_version_still_supported(
        self, version: str, tmp_path: Path
    ) -> None:
        """Strict: a field Kubernetes does not know (a typo) fails as much as a wrong type."""
        docs = list(_documents())
        docs += [("secrets", doc) for doc in _load(_secrets(tmp_path / "pki", "--node", NODE))]
        for name, doc in docs:
            if doc["kind"] in _OPERATOR_KINDS:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                raise AssertionError(
                    f"{name}: {doc['kind']} {doc['metadata']['name']}: {err.message}"
                ) from None

    def test_every_container_has_resource_requests_and_liveness_and_readiness_probes(self) -> None:
        for name, spec in _pod_specs():
            for container in spec["containers"]:
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
                assert container["livenessProbe"]["httpGet"]["path"] in ("/health", "/metrics"), name
                assert container["readinessProbe"]["httpGet"], name

    def test_the_admin_listener_stays_on_the_pods_loopback_and_no_service_exposes_it(self) -> None:
        server_yaml = YAML(typ="safe").load(_kind("ConfigMap", "llmgw-server")["data"]["server.yaml"])
        assert server_yaml["admin_listen"].startswith("127.0.0.1:")
        ports = [
            p["port"] for _, doc in _documents() if doc["kind"] == "Service" for p in doc["spec"]["ports"]
        ]
        assert 9090 not in ports

    def test_the_agent_runs_on_gpu_nodes_with_the_nvidia_runtime_and_keeps_engines_and_weights_on_the_node(
        self,
    ) -> None:
        spec = _kind("DaemonSet", "llmgw-agent")["spec"]["template"]["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        agent_yaml = YAML(typ="safe").load(_kind("ConfigMap", "llmgw-agent")["data"]["agent.yaml"])
        assert {agent_yaml["state_dir"], agent_yaml["weights_cache"]} <= host_paths
        secret = next(v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v)
        assert secret == "llmgw-agent-tls"

    def test_pods_carry_prometheus_annotations_on_the_port_their_metrics_listen_names(self) -> None:
        for name, config_key in (("llmgw-server", "server.yaml"), ("llmgw-agent", "agent.yaml")):
            kind = "Deployment" if name == "llmgw-server" else "DaemonSet"
            annotations = _kind(kind, name)["spec"]["template"]["metadata"]["annotations"]
            listen = YAML(typ="safe").load(_kind("ConfigMap", name)["data"][config_key])["metrics_listen"]
            assert annotations["prometheus.io/scrape"] == "true"
            assert listen.endswith(":" + annotations["prometheus.io/port"])

    def test_the_service_monitor_selects_the_gateways_service_by_a_port_it_has(self) -> None:
        monitor = _kind("ServiceMonitor", "llmgw")
        service = _kind("Service", "llmgw")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]


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


def _for_podman(
    docs: list[dict[str, Any]], image: str, label: str, tmp: Path, port: int
) -> list[dict[str, Any]]:
    """The manifests as `podman kube play` (4.3) can run them here, each change a cluster's stand-in.

    It has no Services (the agent dials the server's pod by its name), no DaemonSets (the
    agent's becomes a Deployment of one, on a "node" named node-1), no GPU runtime, and no
    downward API for spec.nodeName. Everything else (probes, volumes, security contexts,
    the agent's start command) runs as written.
    """
    out = []
    for doc in copy.deepcopy(docs):
        doc["metadata"].pop("namespace", None)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "llmgw-server":
            _edit_config(
                doc, "server.yaml", models=[SIM_MODEL], engines={"llamacpp": ""},
                control={"enabled": True, "interval_s": 0.5, "grace_s": 3.0, "base_backoff_s": 1.0},
            )  # fmt: skip
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "llmgw-agent":
            _edit_config(
                doc, "agent.yaml", servers=["llmgw-server-pod-0:7443"], heartbeat_interval_s=0.5,
                engines={"disabled": ["llamacpp", "vllm", "sglang"]},
            )  # fmt: skip
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
                container["image"] = image
                for p in container.get("ports", []):
                    if p["name"] == "gateway":
                        p.update(hostPort=port, hostIP="127.0.0.1")
        out.append(doc)
    return out


def _create_secret(podman: Podman, doc: dict[str, Any], path: Path) -> None:
    """A Secret as podman 4.3's kube play reads it: a podman secret holding the manifest.

    It writes each `data` value into the volume as it finds it, without decoding the base64,
    so the values go in decoded.
    """
    plain = copy.deepcopy(doc)
    plain["data"] = {k: base64.b64decode(v).decode() for k, v in doc["data"].items()}
    path.write_text(json.dumps(plain))
    name = doc["metadata"]["name"]
    podman("secret", "create", name, str(path))
    podman.secrets.append(name)


def _play(podman: Podman, image: str, tmp_path: Path, files: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """`podman kube play` of files (and the Secrets); the gateway's port on 127.0.0.1 and what was played."""
    secrets = _load(_secrets(tmp_path / "pki", "--node", NODE, "--host", "llmgw-server-pod-0"))
    for doc in secrets:
        _create_secret(podman, doc, tmp_path / f"{doc['metadata']['name']}.json")
    docs = [doc for name in files for doc in _load((MANIFESTS / name).read_text())]
    podman.volumes += [
        d["metadata"]["name"] for d in docs if d["kind"] in ("ConfigMap", "PersistentVolumeClaim")
    ]
    podman.volumes += [d["metadata"]["name"] for d in secrets]
    port = _free_port()
    played = _for_podman(docs, image, podman.label, tmp_path, port)
    play = tmp_path / "play.yaml"
    with play.open("w") as f:
        YAML(typ="safe").dump_all(played, f)
    podman("kube", "play", "--network", podman.network, str(play), timeout_s=300)
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


# The image fixture builds the image when this test is the session's first to need it.
@pytest.mark.slow
@pytest.mark.timeout(900)
class TestPodmanKubePlay:
    def test_the_manifests_server_and_agent_serve_a_chat_with_the_sim_engine(
        self, podman: Podman, image: str, tmp_path: Path
    ) -> None:
        """The Secrets `llmgw cert kubernetes-secrets` writes, deploy/kubernetes's ConfigMaps and pods."""
        started = time.monotonic()
        port, _ = _play(podman, image, tmp_path, ["server.yaml", "agent.yaml"])
        server = "llmgw-server-pod-0-server"
        # As docs/kubernetes.md has them run with kubectl exec: server.yaml where they look unasked.
        key = podman("exec", server, "llmgw", "keys", "create", "first").strip()
        body = first_chat(podman, f"http://127.0.0.1:{port}", key, [server, "llmgw-agent-pod-0-agent"])
        print(f"\nkube play to first answered chat: {time.monotonic() - started:.1f} s")
        assert body["choices"][0]["message"]["content"]
        assert NODE in podman("exec", server, "llmgw", "ctl", "nodes")

    def test_every_probe_answers_in_the_running_pods_and_the_mirror_answers_the_server_pod(
        self, podman: Podman, image: str, tmp_path: Path
    ) -> None:
        """kube play makes the probes systemd timers, which this machine lacks: each is asked here."""
        _, played = _play(podman, image, tmp_path, ["server.yaml", "agent.yaml", "mirror.yaml"])
        for container, url in _probes(played):
            answered = functools.partial(lambda c, u: _status_inside(podman, c, u) == "200", container, url)
            wait_until(answered, 60, f"{url} to answer in {container}")
        # The mirror's pod by its name, standing in for its Service.
        mirror = "http://llmgw-mirror-pod-0:8081/health"
        assert _status_inside(podman, "llmgw-server-pod-0-server", mirror) == "200"
