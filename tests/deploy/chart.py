"""The chart in deploy/helm/llmgw as `helm template` renders it, for its tests."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests import needs

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "llmgw"
NAMESPACE = "llmgw"
# What `helm template` is told the cluster has: the Prometheus operator's API, so that the monitors render.
OPERATOR_API = "monitoring.coreos.com/v1"

# Everything the chart can make, on each store.
SQLITE = {
    "agent.enabled": "true",
    "mirror.enabled": "true",
    "ingress.enabled": "true",
    "ingress.tlsSecret": "llmgw-ingress-tls",
    "adminToken.secretName": "llmgw-admin-token",
}
POSTGRESQL = {
    **SQLITE,
    "database.type": "postgresql",
    "server.replicas": "2",
    "database.url.secretName": "llmgw-postgres",
}
STORES = {"sqlite": SQLITE, "postgresql": POSTGRESQL}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [needs.helm(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO
    )


def _set(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def template(
    values: dict[str, str], files: Sequence[Path] = (), api_versions: Sequence[str] = (OPERATOR_API,)
) -> list[dict[str, Any]]:
    """The objects `helm template` renders with values (--set) and values files."""
    args = ["template", "llmgw", str(CHART), "--namespace", NAMESPACE, *_set(values)]
    args += [arg for f in files for arg in ("--values", str(f))]
    args += [arg for api in api_versions for arg in ("--api-versions", api)]
    done = helm(*args)
    assert done.returncode == 0, f"helm template failed: {done.stderr}"
    return [doc for doc in YAML(typ="safe").load_all(done.stdout) if doc]


def refusal(values: dict[str, str]) -> str:
    """What helm says refusing values; fails the test if it renders them."""
    done = helm("template", "llmgw", str(CHART), *_set(values))
    assert done.returncode != 0, f"helm rendered {values}"
    return done.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert found, f"no {kind} {name} rendered"
    return found[0]
