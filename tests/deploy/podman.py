"""Podman for the image's tests: the image built once, and a network whose containers are all removed.

Two settings this kind of machine needs, found by trying: crun refuses to start anything
("cgroups in hybrid mode not supported") where runc works, and podman's default ulimits are
above the machine's hard limit on open files ("setrlimit RLIMIT_NOFILE: Operation not
permitted"). A containers.conf written here and named by CONTAINERS_CONF gives both.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from llmgw import pki
from tests import needs

# The image's llmgw user: the files a container reads as it are handed to it.
IMAGE_UID = 999

CONTAINERS_CONF = """\
[engine]
runtime = "runc"
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[network]
network_backend = "netavark"
"""

_T = TypeVar("_T")

# The model both tests serve: the built-in sim engine, which needs nothing downloaded.
SIM_MODEL = {"name": "sim-chat", "replicas": 1, "profiles": [{"engine": "sim"}]}


def wait_until(predicate: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """predicate()'s first true answer within timeout_s; otherwise fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    last = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)
        last = predicate()
    return last


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON body) of one exchange; (0, None) when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            raw, status = reply.read(), reply.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    except (urllib.error.URLError, OSError):
        return 0, None
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


class Podman:
    """`podman` with this test's containers.conf; everything it starts is labelled, to be removed."""

    def __init__(self, conf: Path, label: str) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.label = label
        self.network = f"{label}-net"
        # What `podman kube play` leaves behind by name: its Secrets' and volumes' (ConfigMaps, claims).
        self.secrets: list[str] = []
        self.volumes: list[str] = []

    def __call__(self, *args: str, check: bool = True, timeout_s: float = 120) -> str:
        done = subprocess.run(
            ["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def run(self, name: str, image: str, args: Sequence[str], options: Sequence[str] = ()) -> str:
        """Start container name on the network, detached; its id."""
        return self(
            "run", "-d", "--name", name, "--label", f"llmgw-test={self.label}", "--network", self.network,
            *options, image, *args,
        ).strip()  # fmt: skip

    def published(self, name: str, port: int) -> str:
        """host:port a container's port is published on (127.0.0.1, a port podman chose)."""
        return self("port", name, f"{port}/tcp").strip().splitlines()[0]

    def logs(self, name: str) -> str:
        done = subprocess.run(
            ["podman", "logs", name], capture_output=True, text=True, env=self.env, timeout=60, check=False
        )
        return done.stdout + done.stderr

    def remove_all(self) -> None:
        """Every container and pod of this test, then its network, whatever state they are in."""
        for pod in self("pod", "ps", "-q", "--filter", f"label=llmgw-test={self.label}", check=False).split():
            self("pod", "rm", "-f", "-t", "2", pod, check=False)
        for box in self("ps", "-aq", "--filter", f"label=llmgw-test={self.label}", check=False).split():
            self("rm", "-f", "-t", "2", box, check=False)
        for secret in self.secrets:
            self("secret", "rm", secret, check=False)
        for volume in self.volumes:
            self("volume", "rm", "-f", volume, check=False)
        self("network", "rm", "-f", self.network, check=False)


def require_podman() -> None:
    needs.root("running containers with rootful podman and building the image with mmdebstrap")
    for program in ("podman", "runc", "mmdebstrap", "iptables"):
        needs.program(program, "mmdebstrap" if program == "mmdebstrap" else program)


def certificates(directory: Path, server_names: Sequence[str], nodes: Sequence[str]) -> Path:
    """An authority and the server's and nodes' certificates in directory, readable by the image's user."""
    pki.init_ca(directory)
    pki.issue_server(directory, "server", server_names, directory)
    for node in nodes:
        pki.issue_agent(directory, node, directory)
    for path in [directory, *directory.iterdir()]:
        os.chown(path, IMAGE_UID, IMAGE_UID)
    return directory


def chat(gateway: str, key: str) -> tuple[int, Any]:
    return http(
        "POST",
        f"{gateway}/v1/chat/completions",
        {"model": "sim-chat", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        {"Authorization": f"Bearer {key}"},
    )


def first_chat(box: Podman, gateway: str, key: str, containers: list[str]) -> dict[str, Any]:
    """The first answered chat through gateway, once the sim replica is placed and ready."""

    def answered() -> dict[str, Any] | None:
        for name in containers:
            state = box("inspect", "--format", "{{.State.Running}}", name, check=False).strip()
            assert state != "false", f"{name} exited:\n{box.logs(name)[-3000:]}"
        status, body = chat(gateway, key)
        return body if status == 200 else None

    try:
        return wait_until(answered, 120, "a chat answered through the gateway")
    except AssertionError:
        logs = "\n".join(f"--- {name} ---\n{box.logs(name)[-3000:]}" for name in containers)
        raise AssertionError(f"no chat was answered; the containers' logs:\n{logs}") from None
