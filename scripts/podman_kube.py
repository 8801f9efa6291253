"""The Helm chart as `podman kube play` runs it, on one machine and without a cluster.

    helm template llmgw deploy/helm/llmgw --values my-values.yaml > rendered.yaml
    python3 scripts/podman_kube.py rendered.yaml secrets.yaml --out play
    sh play/up.sh      # the podman secrets, the network, then podman kube play
    sh play/down.sh    # every pod, volume and secret it made, the store's volume too

Run it with the Python llmgw is installed in (it reads YAML with ruamel.yaml, which llmgw
depends on). kube play (podman 4.3) has no Services, DaemonSets, runtime classes or downward
API, and reads Secrets its own ways; each change here is the stand-in a cluster would give:

- the agent dials the server's pod by its name (SERVER_POD:7443, `--server-pod`), which the
  server's certificate must carry (`llmgw cert kubernetes-secrets --host SERVER_POD`);
- the agent's DaemonSet becomes a Deployment of one, on a node named `--node`, its host paths
  directories under `--host-dir`, with no GPU runtime, node selector or tolerations;
- the gateway's port is published on the host (`--gateway-port`, on 127.0.0.1 unless
  `--gateway-ip` says otherwise), standing in for its Service;
- each Secret becomes a podman secret: one mounted as a volume (the certificates) is the
  manifest with its values decoded, since kube play writes it into the volume without decoding
  the base64; one read into the environment (the admin token's, PostgreSQL's URL) is its `data`
  alone, a JSON map of base64 values, which is how kube play reads that one;
- what kube play does not run (Ingress, the Prometheus operator's monitors) is left out,
  named on stderr.

Everything else runs as rendered: the start scripts, volumes, security contexts and probes.
"""

from __future__ import annotations

import argparse
import base64
import copy
import io
import json
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

# What kube play runs; other kinds are left out, and DaemonSets become Deployments.
_PLAYED = ("Deployment", "ConfigMap", "PersistentVolumeClaim", "Service")
AGENT_PORT = 7443


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every object in the YAML files ("-": standard input), in order."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        docs += [doc for doc in YAML(typ="safe").load_all(text) if doc]
    return docs


def podman_variant(
    docs: list[dict[str, Any]],
    *,
    node: str,
    host_dir: Path,
    gateway_port: int,
    gateway_ip: str = "127.0.0.1",
    server_pod: str = "llmgw-server-pod-0",
    labels: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects kube play runs, and the kinds left out ("Ingress llmgw")."""
    out, left_out = [], []
    for doc in copy.deepcopy(docs):
        kind = doc["kind"]
        if kind == "Secret":
            continue
        if kind not in (*_PLAYED, "DaemonSet"):
            left_out.append(f"{kind} {doc['metadata']['name']}")
            continue
        doc["metadata"].pop("namespace", None)
        if kind == "ConfigMap" and doc["metadata"]["name"] == "llmgw-agent":
            _edit_config(doc, "agent.yaml", servers=[f"{server_pod}:{AGENT_PORT}"])
        if kind == "DaemonSet":
            _one_agent(doc, node, host_dir)
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            template["metadata"].setdefault("labels", {}).update(labels or {})
            for container in template["spec"]["containers"]:
                for port in container.get("ports", []):
                    if port["name"] == "gateway":
                        port.update(hostPort=gateway_port, hostIP=gateway_ip)
        out.append(doc)
    return out, left_out


def _one_agent(doc: dict[str, Any], node: str, host_dir: Path) -> None:
    """A DaemonSet as a Deployment of one agent, on a node called node, its host paths under host_dir."""
    spec = doc["spec"]
    doc["kind"] = "Deployment"
    doc["spec"] = {"replicas": 1, "selector": spec["selector"], "template": spec["template"]}
    pod = spec["template"]["spec"]
    for key in ("runtimeClassName", "nodeSelector", "tolerations"):
        pod.pop(key, None)
    # kube play has no downward API: spec.nodeName, which names the node, is a value here.
    pod["containers"][0]["env"] = [{"name": "NODE_NAME", "value": node}]
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            volume["hostPath"]["path"] = str(host_dir / volume["name"])


def _edit_config(doc: dict[str, Any], key: str, **changes: Any) -> None:
    data = YAML(typ="safe").load(doc["data"][key])
    data.update(changes)
    out = io.StringIO()
    YAML(typ="safe").dump(data, out)
    doc["data"][key] = out.getvalue()


def mounted_secrets(docs: list[dict[str, Any]]) -> set[str]:
    """The names of the Secrets a pod mounts as a volume (the others are read into the environment)."""
    names = set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "secret" in volume:
                    names.add(volume["secret"]["secretName"])
    return names


def secret_file(doc: dict[str, Any], mounted: bool) -> str:
    """What `podman secret create NAME FILE` is given for a Secret, in the shape kube play reads it."""
    if mounted:
        plain = copy.deepcopy(doc)
        plain["data"] = {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()}
        return json.dumps(plain)
    return json.dumps(doc.get("data", {}))


def volumes(docs: list[dict[str, Any]]) -> list[str]:
    """The podman volumes kube play makes and kube down (before podman 4.4) leaves: claims, ConfigMaps."""
    return [d["metadata"]["name"] for d in docs if d["kind"] in ("ConfigMap", "PersistentVolumeClaim")]


def _up(out: Path, secrets: list[str], network: str) -> str:
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        "# Written by scripts/podman_kube.py: the podman secrets, the network, kube play.",
        "set -e",
    ]
    for name in secrets:
        lines.append(f"podman secret rm {q(name)} >/dev/null 2>&1 || true")
        lines.append(
            f"podman secret create {q(name)} {q(str(out / 'secrets' / (name + '.json')))} >/dev/null"
        )
    lines.append(f"podman network exists {q(network)} || podman network create {q(network)} >/dev/null")
    lines.append(f"podman kube play --network {q(network)} {q(str(out / 'play.yaml'))}")
    return "\n".join(lines) + "\n"


def _down(out: Path, secrets: list[str], kept_volumes: list[str]) -> str:
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        "# Written by scripts/podman_kube.py: every pod, volume and secret up.sh made. The store's",
        "# claim is among the volumes: back it up first (llmgw store backup) if it is to be kept.",
        f"podman kube down {q(str(out / 'play.yaml'))} || true",
        # kube down removes the pods only (podman 4.4 added --force for the volumes): the rest by name.
        *(f"podman volume rm -f {q(name)} >/dev/null 2>&1 || true" for name in [*kept_volumes, *secrets]),
        *(f"podman secret rm {q(name)} >/dev/null 2>&1 || true" for name in secrets),
    ]
    return "\n".join(lines) + "\n"


def write(
    out: Path,
    played: list[dict[str, Any]],
    secret_docs: list[dict[str, Any]],
    mounted: set[str],
    network: str,
) -> None:
    """out/play.yaml, out/secrets/NAME.json, out/up.sh and out/down.sh."""
    (out / "secrets").mkdir(parents=True, exist_ok=True)
    (out / "secrets").chmod(0o700)
    with (out / "play.yaml").open("w") as f:
        YAML(typ="safe").dump_all(played, f)
    names = []
    for doc in secret_docs:
        name = doc["metadata"]["name"]
        path = out / "secrets" / f"{name}.json"
        path.write_text(secret_file(doc, name in mounted))
        path.chmod(0o600)
        names.append(name)
    (out / "up.sh").write_text(_up(out, names, network))
    (out / "down.sh").write_text(_down(out, names, volumes(played)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="helm template's output and the Secrets' YAML")
    parser.add_argument(
        "--out", type=Path, required=True, help="where play.yaml, secrets/, up.sh, down.sh go"
    )
    parser.add_argument("--node", default="node-1", help="the agent's node name (its certificate's)")
    parser.add_argument(
        "--host-dir", type=Path, help="the agent's host paths go under it [default: OUT/host]"
    )
    parser.add_argument("--gateway-port", type=int, default=8080, help="the host port of the gateway")
    parser.add_argument("--gateway-ip", default="127.0.0.1", help="the host address it is published on")
    parser.add_argument(
        "--server-pod", default="llmgw-server-pod-0", help="the server pod's name, as podman names it"
    )
    parser.add_argument("--network", default="llmgw", help="the podman network the pods join")
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a label for every pod"
    )
    args = parser.parse_args(argv)
    docs = load(args.files)
    out = args.out.absolute()
    host_dir = (args.host_dir or out / "host").absolute()
    labels = dict(label.split("=", 1) for label in args.label)
    played, left_out = podman_variant(
        docs,
        node=args.node,
        host_dir=host_dir,
        gateway_port=args.gateway_port,
        gateway_ip=args.gateway_ip,
        server_pod=args.server_pod,
        labels=labels,
    )
    for volume in (
        v for d in played if d["kind"] == "Deployment" for v in d["spec"]["template"]["spec"]["volumes"]
    ):
        if "hostPath" in volume:
            Path(volume["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)
    secret_docs = [d for d in docs if d["kind"] == "Secret"]
    write(out, played, secret_docs, mounted_secrets(docs), args.network)
    for what in left_out:
        print(f"podman_kube: left out {what}: kube play does not run it", file=sys.stderr)
    print(f"podman_kube: wrote {out}/play.yaml; run sh {out}/up.sh, and sh {out}/down.sh to remove it all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
