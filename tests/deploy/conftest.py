"""The image and podman fixtures of tests/deploy (tests/deploy/podman.py says why they are so)."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="session")
def containerfile_image(image: str) -> Iterator[str]:
    """The Containerfile built with `buildah bud` from the root file system build-image.sh made.

    Given the labels `make image` gives its image, so that the two can be compared whole.
    """
    rootfs = Path(_run(["scripts/build-image.sh", "--rootfs"]).strip().splitlines()[-1])
    labels = json.loads(_run(["podman", "image", "inspect", image]))[0]["Config"]["Labels"]
    name = f"localhost/llmgw-containerfile:{rootfs.stem}"
    args = [
        arg
        for key in ("version", "source", "revision")
        for arg in ("--build-arg", f"{key.upper()}={labels[f'org.opencontainers.image.{key}']}")
    ]
    containerfile = str(REPO / "Containerfile")
    args += ["--build-arg", f"ROOTFS={rootfs.name}", "-t", name, str(rootfs.parent)]
    _run(["buildah", "bud", "--quiet", "-f", containerfile, *args])
    yield name
    subprocess.run(["podman", "rmi", name], capture_output=True, check=False)


def _run(args: list[str]) -> str:
    done = subprocess.run(
        args,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


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
