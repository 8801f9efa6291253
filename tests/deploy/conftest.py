"""The image and podman fixtures of tests/deploy (tests/deploy/podman.py says why they are so)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .podman import CONTAINERS_CONF, Podman, require_podman

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def image() -> str:
    """The image scripts/build-image.sh builds from this tree (its cache makes a second run quick)."""
    require_podman()
    done = subprocess.run(
        ["scripts/build-image.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"scripts/build-image.sh exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def podman(tmp_path: Path) -> Iterator[Podman]:
    """A Podman on a network of its own; its containers, pods and network are gone afterwards."""
    require_podman()
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    box = Podman(conf, f"llmgw-{secrets.token_hex(4)}")
    try:
        box("network", "create", box.network)
        yield box
    finally:
        box.remove_all()
