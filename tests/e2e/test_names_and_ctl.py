"""A real `llmgw --dev` on port 0: `ctl --config` finds it, and an org/model is added, served and removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from .conftest import RunningLlmgw, post_json, wait_until

pytestmark = pytest.mark.e2e

ORG_MODEL = "acme/sim-org"


def _ctl(dev_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`llmgw ctl --config DEVDIR/server.yaml …` as a person types it: no --server, no token."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "--config", str(dev_dir / "server.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ctl_with_the_dev_config_finds_the_admin_listener_bound_to_port_0(
    dev_llmgw: RunningLlmgw, tmp_path: Path
) -> None:
    dev_dir = tmp_path / ".llmgw-dev"
    # server.yaml names 9090; the server was started with --admin-listen 127.0.0.1:0.
    assert "127.0.0.1:9090" in (dev_dir / "server.yaml").read_text()
    done = _ctl(dev_dir, "status")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "models    1 of 1 serving" in done.stdout
    recorded = json.loads((dev_dir / "listening.json").read_text())
    assert recorded["pid"] == dev_llmgw.process.pid
    assert dev_llmgw.url == f"http://{recorded['gateway']}"
    assert dev_llmgw.stop() == 0
    assert not (dev_dir / "listening.json").exists()


def test_an_org_model_is_added_served_logged_inside_state_dir_and_removed(
    dev_llmgw: RunningLlmgw, tmp_path: Path
) -> None:
    dev_dir = tmp_path / ".llmgw-dev"
    definition = tmp_path / "org.yaml"
    definition.write_text(f"name: {ORG_MODEL}\nreplicas: 1\nprofiles:\n  - engine: sim\n")
    added = _ctl(dev_dir, "model", "add", "-f", str(definition))
    assert added.returncode == 0, added.stderr
    ask = {"model": ORG_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    chat = f"{dev_llmgw.url}/v1/chat/completions"
    wait_until(lambda: post_json(chat, ask, dev_llmgw.key)[0] == 200, 60, f"{ORG_MODEL} to answer")

    client = openai.OpenAI(base_url=f"{dev_llmgw.url}/v1", api_key=dev_llmgw.key, max_retries=0)
    assert client.models.retrieve(ORG_MODEL).id == ORG_MODEL
    reply = client.chat.completions.create(
        model=ORG_MODEL, messages=[{"role": "user", "content": "hello org"}], max_tokens=4
    )
    assert reply.choices[0].message.content == "hello org"

    replicas = _ctl(dev_dir, "--json", "replicas", "--model", ORG_MODEL)
    assert replicas.returncode == 0, replicas.stderr
    (replica,) = json.loads(replicas.stdout)
    shard = replica["shard_id"]
    assert shard.startswith("acme--sim-org-")
    # The engine's log: one file in the agent's shard directory, no folder named after the org.
    shards = dev_dir / "agent" / "shards"
    assert (shards / f"{shard}.log").is_file()
    assert not (shards / "acme").exists()
    logs = _ctl(dev_dir, "logs", "dev-node", "--source", shard)
    assert logs.returncode == 0, logs.stderr
    assert f"serving {ORG_MODEL}" in logs.stdout

    removed = _ctl(dev_dir, "model", "remove", ORG_MODEL)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout == f"removed {ORG_MODEL}: its replicas are being stopped\n"
    wait_until(lambda: post_json(chat, ask, dev_llmgw.key)[0] == 404, 30, f"{ORG_MODEL} to be gone")
    assert [m.id for m in client.models.list()] == ["sim-chat"]
