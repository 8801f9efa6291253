"""scripts/podman_kube.py on what the chart renders, without podman: what it writes for kube play.

tests/deploy/test_kubernetes.py runs what it writes under podman (up.sh, a chat, down.sh).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from ruamel.yaml import YAML

from llmgw.cli.cert import cert
from tests.deploy.chart import REPO, template

SCRIPT = REPO / "scripts" / "podman_kube.py"
VALUES = REPO / "tests" / "deploy" / "podman-values.yaml"


def _dump(docs: list[dict[str, Any]], path: Path) -> Path:
    with path.open("w") as f:
        YAML(typ="safe").dump_all(docs, f)
    return path


def _made(tmp_path: Path) -> tuple[Path, str]:
    """The script run as docs/kubernetes.md runs it: its output directory, and what it printed."""
    pki = tmp_path / "pki"
    runner = CliRunner()
    assert runner.invoke(cert, ["init-ca", "--dir", str(pki)]).exit_code == 0
    args = ["kubernetes-secrets", "--dir", str(pki), "--node", "node-1", "--host", "llmgw-server-pod-0"]
    done = runner.invoke(cert, [*args, "--admin-token", "--out", str(tmp_path / "secrets.yaml")])
    assert done.exit_code == 0, done.output
    rendered = _dump(template({}, files=[VALUES]), tmp_path / "rendered.yaml")
    out = tmp_path / "play"
    argv = [sys.executable, str(SCRIPT), str(rendered), str(tmp_path / "secrets.yaml"), "--out", str(out)]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    return out, ran.stdout + ran.stderr


def _played(out: Path) -> list[dict[str, Any]]:
    return [d for d in YAML(typ="safe").load_all((out / "play.yaml").read_text()) if d]


def test_the_agent_dials_the_server_pod_by_name_as_a_deployment_of_one(tmp_path: Path) -> None:
    out, said = _made(tmp_path)
    played = _played(out)
    assert {d["kind"] for d in played} <= {"Deployment", "ConfigMap", "PersistentVolumeClaim", "Service"}
    agent_config = next(
        d for d in played if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "llmgw-agent"
    )
    assert YAML(typ="safe").load(agent_config["data"]["agent.yaml"])["servers"] == ["llmgw-server-pod-0:7443"]
    agent = next(d for d in played if d["metadata"]["name"] == "llmgw-agent" and d["kind"] == "Deployment")
    pod = agent["spec"]["template"]["spec"]
    assert agent["spec"]["replicas"] == 1 and "runtimeClassName" not in pod
    assert pod["containers"][0]["env"] == [{"name": "NODE_NAME", "value": "node-1"}]
    server = next(d for d in played if d["metadata"]["name"] == "llmgw-server" and d["kind"] == "Deployment")
    gateway = next(
        p for p in server["spec"]["template"]["spec"]["containers"][0]["ports"] if p["name"] == "gateway"
    )
    assert (gateway["hostPort"], gateway["hostIP"]) == (8080, "127.0.0.1")
    assert "left out ServiceMonitor llmgw: kube play does not run it" in said


def test_each_secret_is_written_in_the_shape_kube_play_reads_it(tmp_path: Path) -> None:
    out, _ = _made(tmp_path)
    mounted = json.loads((out / "secrets" / "llmgw-server-tls.json").read_text())
    assert mounted["kind"] == "Secret" and mounted["data"]["ca.pem"].startswith("-----BEGIN CERTIFICATE-----")
    token = json.loads((out / "secrets" / "llmgw-admin-token.json").read_text())
    assert set(token) == {"token"} and base64.b64decode(token["token"])
    assert (out / "secrets" / "llmgw-admin-token.json").stat().st_mode & 0o077 == 0


def test_down_removes_the_pods_then_every_volume_and_secret_by_name(tmp_path: Path) -> None:
    """`podman kube down` alone (podman 4.3) leaves the volumes, the store's among them, and the secrets."""
    out, _ = _made(tmp_path)
    down = (out / "down.sh").read_text().splitlines()
    assert f"podman kube down {out}/play.yaml || true" in down
    for volume in ("llmgw-server-state", "llmgw-server", "llmgw-agent", "llmgw-server-tls"):
        assert f"podman volume rm -f {volume} >/dev/null 2>&1 || true" in down
    for secret in ("llmgw-server-tls", "llmgw-agent-tls", "llmgw-admin-token"):
        assert f"podman secret rm {secret} >/dev/null 2>&1 || true" in down
    up = (out / "up.sh").read_text()
    assert f"podman kube play --network llmgw {out}/play.yaml" in up
