"""Weights fetched across hosts: from a mirror on its own host, by every node that runs the model."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from .cluster import MIRROR_PORT, Fleet

# Each role a real llmgw process on hosts made of network namespaces (conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_both_nodes_fetch_a_models_weights_from_a_mirror_on_its_own_host(
    fleet: Fleet, tmp_path: Path
) -> None:
    weights = os.urandom(256 * 1024)
    root = tmp_path / "mirror"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "model.bin").write_bytes(weights)
    mirror = fleet.network.hosts["mh"]
    fleet.start_mirror(mirror, root)
    digest = hashlib.sha256(weights).hexdigest()
    model = {
        "name": "sim-weights",
        "replicas": 2,
        "source": f"http://{mirror.address}:{MIRROR_PORT}/files/tiny/model.bin",
        "sha256": {"model.bin": digest},
        "profiles": [{"engine": "sim"}],
    }

    replicas = fleet.start(["n1", "n2"], [model])

    assert {r["node"] for r in replicas} == {"n1", "n2"}
    for node in ("n1", "n2"):
        [fetched] = [p for p in (tmp_path / node / "weights").rglob("model.bin") if p.is_file()]
        assert hashlib.sha256(fetched.read_bytes()).hexdigest() == digest, node
    assert fleet.chat("sim-weights").status == 200
