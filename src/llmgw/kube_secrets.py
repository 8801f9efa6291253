"""The Kubernetes Secrets of a cluster's certificates, as `llmgw cert kubernetes-secrets` writes them.

Two Secrets, so that each pod mounts only what it needs: the server's certificate and key,
and every node's certificate and key in the one Secret the agent's DaemonSet mounts (each
agent picks its own by its node's name). The authority's key never goes in: it stays where
the authority is, and a node added later is a second run of the command. Asked, a third:
an admin token, which the Helm chart's server reads (`adminToken.secretName`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path

import attrs
from ruamel.yaml import YAML

from llmgw import pki
from llmgw.adminapi.auth import new_token

SERVER_SECRET = "llmgw-server-tls"
AGENT_SECRET = "llmgw-agent-tls"
# Its files in the authority's directory: not server.pem, which a control plane outside the
# cluster may already have there for other names.
SERVER_CERT = "kubernetes-server"
ADMIN_TOKEN_SECRET = "llmgw-admin-token"
# Kept beside the certificates, so that a second run (a node added) writes the same token
# rather than a new one that would lock out whoever uses the first.
ADMIN_TOKEN_FILE = "kubernetes-admin-token"
# The agent service's own Service: the names an agent in the cluster dials.
AGENT_SERVICE = "llmgw-agents"


@attrs.frozen
class SecretsRequest:
    """What the Secrets are for: the authority's directory, the namespace and who gets a certificate."""

    ca_dir: Path
    namespace: str
    nodes: Sequence[str]
    # Extra names of the agent service beyond the Service's own (a LoadBalancer's, for nodes outside).
    server_hosts: Sequence[str] = ()
    # Whether to write the admin token's Secret too.
    admin_token: bool = False


def service_names(namespace: str) -> list[str]:
    """Every name a pod in the cluster may dial the agent service by, short to fully qualified."""
    return [
        AGENT_SERVICE,
        f"{AGENT_SERVICE}.{namespace}",
        f"{AGENT_SERVICE}.{namespace}.svc",
        f"{AGENT_SERVICE}.{namespace}.svc.cluster.local",
    ]


def _secret(name: str, namespace: str, files: dict[str, bytes]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "llmgw"}},
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode() for key, value in sorted(files.items())},
    }


def secret_manifests(request: SecretsRequest) -> str:
    """Issue what is missing (server, each node) into ca_dir; the Secrets' YAML, one document each.

    A certificate already in ca_dir is kept, so that running it again for a new node does not
    change every other node's Secret entry under a running DaemonSet.
    """
    ca_dir = request.ca_dir
    ca = (ca_dir / pki.CA_CERT).read_bytes()
    hosts = [*service_names(request.namespace), *request.server_hosts]
    server_pem = ca_dir / f"{SERVER_CERT}.pem"
    # Reissued only for a name it lacks: a run for a new node leaves the server's Secret as it
    # was, and applying it changes nothing the server reads.
    if not server_pem.exists() or set(hosts) - set(pki.certificate_names(server_pem)):
        pki.issue_server(ca_dir, SERVER_CERT, hosts, ca_dir)
    server = {
        pki.CA_CERT: ca,
        "server.pem": (ca_dir / f"{SERVER_CERT}.pem").read_bytes(),
        "server-key.pem": (ca_dir / f"{SERVER_CERT}-key.pem").read_bytes(),
    }
    agents = {pki.CA_CERT: ca}
    for node in request.nodes:
        if not (ca_dir / f"{node}.pem").exists():
            pki.issue_agent(ca_dir, node, ca_dir)
        agents[f"{node}.pem"] = (ca_dir / f"{node}.pem").read_bytes()
        agents[f"{node}-key.pem"] = (ca_dir / f"{node}-key.pem").read_bytes()
    documents = [
        _secret(SERVER_SECRET, request.namespace, server),
        _secret(AGENT_SECRET, request.namespace, agents),
    ]
    if request.admin_token:
        documents.append(_secret(ADMIN_TOKEN_SECRET, request.namespace, {"token": admin_token(ca_dir)}))
    out = io.StringIO()
    yaml = YAML()
    yaml.explicit_start = True
    yaml.dump_all(documents, out)
    return out.getvalue()


def admin_token(ca_dir: Path) -> bytes:
    """The admin token kept in ca_dir, made on the first call; readable by its owner alone."""
    path = ca_dir / ADMIN_TOKEN_FILE
    if not path.exists():
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(new_token() + "\n")
    return path.read_text().strip().encode()
