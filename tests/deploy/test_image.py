"""The image scripts/build-image.sh builds: its shape, and a server and an agent serving a chat in it."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from .podman import IMAGE_UID, SIM_MODEL, Podman, certificates, first_chat, http

# The first test of a session builds the image (about a minute; several on a loaded machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SERVER = "llmgw-server"
NODE = "node-1"


def _write(path: Path, data: dict[str, Any]) -> Path:
    with path.open("w") as f:
        YAML().dump(data, f)
    os.chown(path, IMAGE_UID, IMAGE_UID)
    return path


def _tls(cert: str) -> dict[str, str]:
    return {
        "ca": "/etc/llmgw/pki/ca.pem",
        "cert": f"/etc/llmgw/pki/{cert}.pem",
        "key": f"/etc/llmgw/pki/{cert}-key.pem",
    }


def _server_yaml(path: Path, admin_token: str) -> Path:
    return _write(
        path,
        {
            "listen": "0.0.0.0:8080",
            "admin_listen": "127.0.0.1:9090",
            "agent_listen": "0.0.0.0:7443",
            "state_dir": "/var/lib/llmgw",
            "admin_tokens": [hashlib.sha256(admin_token.encode()).hexdigest()],
            "tls": _tls("server"),
            "control": {"interval_s": 0.5, "grace_s": 3.0, "base_backoff_s": 1.0},
            # Nothing a node would download: the machine reaches no release site.
            "engines": {"llamacpp": ""},
            "models": [SIM_MODEL],
        },
    )


def _agent_yaml(path: Path) -> Path:
    return _write(
        path,
        {
            "node_id": NODE,
            "servers": [f"{SERVER}:7443"],
            "state_dir": "/var/lib/llmgw",
            "heartbeat_interval_s": 0.5,
            "tls": _tls(NODE),
            "engines": {"disabled": ["llamacpp", "vllm", "sglang"]},
        },
    )


class TestTheImage:
    def test_it_runs_llmgw_as_the_non_root_user_owning_its_state_and_config_directories(
        self, podman: Podman, image: str
    ) -> None:
        config = json.loads(podman("image", "inspect", image))[0]["Config"]
        assert config["User"] == "llmgw"
        assert config["Entrypoint"] == ["/opt/llmgw/bin/llmgw"]
        assert config["WorkingDir"] == "/var/lib/llmgw"
        assert {"org.opencontainers.image.version", "org.opencontainers.image.source"} <= set(
            config["Labels"]
        )
        who = podman(
            "run",
            "--rm",
            "--entrypoint",
            "/bin/sh",
            image,
            "-c",
            "id -u; stat -c %U /var/lib/llmgw /etc/llmgw",
        )
        # /etc/llmgw too: the chart's server writes server.yaml there, into an empty volume.
        assert who.split() == [str(IMAGE_UID), "llmgw", "llmgw"]

    def test_it_is_smaller_than_250_mb_and_holds_no_pip_to_reach_a_network_with(
        self, podman: Podman, image: str
    ) -> None:
        size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
        assert size < 250_000_000, f"the image is {size / 1e6:.0f} MB"
        probe = "import importlib.util; print(importlib.util.find_spec('pip') is None)"
        assert (
            podman("run", "--rm", "--entrypoint", "/opt/llmgw/bin/python", image, "-c", probe).strip()
            == "True"
        )

    def test_the_containerfile_gives_the_image_the_settings_make_image_gives_it(
        self, podman: Podman, image: str, containerfile_image: str
    ) -> None:
        """The Containerfile and build-image.sh's `podman import --change` list say them twice."""

        def config(name: str) -> dict[str, Any]:
            found: dict[str, Any] = json.loads(podman("image", "inspect", name))[0]["Config"]
            found["Labels"].pop("io.buildah.version", None)
            return found

        assert config(containerfile_image) == config(image)

    @pytest.mark.parametrize("built_by", ["image", "containerfile_image"])
    def test_a_server_and_an_agent_in_containers_serve_a_chat_with_the_sim_engine(
        self, podman: Podman, built_by: str, request: pytest.FixtureRequest, tmp_path: Path
    ) -> None:
        """Certificates name the server by its name on the network; the gateway is published on loopback.

        In the image `make image` builds and in the one `buildah bud` builds from the Containerfile.
        """
        image = request.getfixturevalue(built_by)
        pki = certificates(tmp_path / "pki", [SERVER], [NODE])
        admin_token = secrets.token_urlsafe(16)
        server_yaml = _server_yaml(tmp_path / "server.yaml", admin_token)
        agent_yaml = _agent_yaml(tmp_path / "agent.yaml")
        state = tmp_path / "state"
        state.mkdir()
        os.chown(state, IMAGE_UID, IMAGE_UID)
        mounts = ["-v", f"{pki}:/etc/llmgw/pki:ro", "-v", f"{state}:/var/lib/llmgw"]
        config = ["--config", "/etc/llmgw/server.yaml"]
        key = podman(
            "run", "--rm", "-v", f"{server_yaml}:/etc/llmgw/server.yaml:ro", *mounts, image,
            "keys", "create", "first", *config,
        ).strip()  # fmt: skip

        started = time.monotonic()
        podman.run(
            SERVER, image, ["--role=server", *config],
            ["-p", "127.0.0.1::8080", "-v", f"{server_yaml}:/etc/llmgw/server.yaml:ro", *mounts],
        )  # fmt: skip
        # Root, as the DaemonSet runs it: an agent installs its engines' packages.
        podman.run(
            "llmgw-agent", image, ["--role=agent", "--config", "/etc/llmgw/agent.yaml"],
            ["--user", "root", "-v", f"{agent_yaml}:/etc/llmgw/agent.yaml:ro",
             "-v", f"{pki}:/etc/llmgw/pki:ro"],
        )  # fmt: skip
        gateway = f"http://{podman.published(SERVER, 8080)}"
        body = first_chat(podman, gateway, key, [SERVER, "llmgw-agent"])
        print(f"\ncontainers started to first answered chat: {time.monotonic() - started:.1f} s")
        assert body["choices"][0]["message"]["content"]
        status, _ = http("GET", f"{gateway}/health")
        assert status == 200
