"""A new user's walk from docs/install.md's dev-mode first model: a GGUF file on disk to a chat.

Nothing but what the page shows: dev mode told on its command line to run a
llama-server, `llmgw ctl model add` with the file's path as its source, and
the openai client. The server pins the file and serves it to the dev node,
which fetches it, checks it and runs the real llama-server on it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from .conftest import launch_dev, post_json, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _ctl(dev_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "--config", str(dev_dir / "server.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_gguf_file_on_disk_is_chatted_with_through_dev_mode_and_the_real_llama_server(
    tmp_path: Path, llama_server: Path
) -> None:
    weights = tmp_path / "models" / "tiny.gguf"
    weights.parent.mkdir()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_tiny_gguf.py"),
            "--vocab",
            str(llama_server / "ggml-vocab-llama-spm.gguf"),
            "--out",
            str(weights),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    binary = llama_server / "bin" / "llama-server"
    with launch_dev(tmp_path, args=["--engine", f"llamacpp={binary}"]) as dev:
        dev_dir = tmp_path / ".llmgw-dev"
        definition = tmp_path / "tiny.yaml"
        definition.write_text(f"name: tiny\nsource: {weights}\nprofiles:\n  - engine: llamacpp\n")
        added = _ctl(dev_dir, "model", "add", "-f", str(definition))
        assert added.returncode == 0, added.stderr
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        chat = f"{dev.url}/v1/chat/completions"
        wait_until(lambda: post_json(chat, ask, dev.key)[0] == 200, 120, "tiny to answer")

        client = openai.OpenAI(base_url=f"{dev.url}/v1", api_key=dev.key, max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        # The node ran the file the server pinned at `model add`, fetched from the server.
        pinned = hashlib.sha256(weights.read_bytes()).hexdigest()
        cached = list((dev_dir / "agent" / "weights").glob("*/tiny.gguf"))
        assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in cached] == [pinned]


def test_a_hugging_face_directory_for_llamacpp_is_refused_at_model_add_naming_the_engines(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "Qwen2.5-0.5B"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"\0" * 16)
    with launch_dev(tmp_path) as _:
        definition = tmp_path / "qwen.yaml"
        definition.write_text(f"name: qwen\nsource: {directory}\nprofiles:\n  - engine: llamacpp\n")
        added = _ctl(tmp_path / ".llmgw-dev", "model", "add", "-f", str(definition))
        assert added.returncode == 1
        assert (
            "a Hugging Face safetensors directory: serve it with vllm or sglang; for llama.cpp, a GGUF file"
            in (added.stderr)
        )


def test_a_llamacpp_model_in_plain_dev_mode_is_explained_with_what_to_set(tmp_path: Path) -> None:
    """Dev mode installs nothing: the model waits, and `ctl explain` says how to give the node llama.cpp."""
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF" + b"\0" * 60)
    with launch_dev(tmp_path):
        dev_dir = tmp_path / ".llmgw-dev"
        definition = tmp_path / "tiny.yaml"
        definition.write_text(f"name: tiny\nsource: file://{weights}\nprofiles:\n  - engine: llamacpp\n")
        added = _ctl(dev_dir, "model", "add", "-f", str(definition))
        assert added.returncode == 0, added.stderr
        explained = _ctl(dev_dir, "explain", "tiny")
        assert explained.returncode == 0, explained.stderr
        assert (
            'does not have llamacpp installed: set server.yaml `engines: {llamacpp: "b11434"}` for every '
            "node to install it, or agent.yaml `engines.llamacpp.binary` to a build of your own"
        ) in " ".join(explained.stdout.split())
