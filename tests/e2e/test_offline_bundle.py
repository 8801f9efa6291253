"""An offline site end to end: a bundle made where the publishers answer, imported where none does.

`llmgw bundle create` (the command, as a person runs it) gathers llmgw's wheel
built from this tree, the real llama-server archive from a stand-in for
GitHub's releases, and the tiny GGUF from a stand-in for the Hugging Face hub.
Both stand-ins are then stopped. `llmgw bundle import` checks the tar and
fills the mirror; the mirror, the server and the agent start with the
publishers' addresses still configured and nothing answering there; the node
installs llama.cpp and fetches the weights from the mirror alone, and the real
llama-server answers a chat through the gateway.

Needs the build in ${LLMGW_BUILD_CACHE:-~/.cache/llmgw/llama-server}/11434/
(`make test` builds it), as tests/e2e/test_llamacpp.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import openai
import pytest

from llmgw import config, pki
from llmgw.config import AgentConfig, MirrorConfig, ServerConfig, TLSConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.mirror import mirror_role
from llmgw.roles.server import ServerHandle, server_role
from tests.e2e.test_llamacpp import (
    ASSET,
    NODE,
    REPO,
    TAG,
    WAIT_S,
    FakeGitHub,
    _eventually,
    _read_build,
    _serve,
    _write_tiny_model,
)
from tests.mirror.test_fetch import COMMIT, Hub, hub_app
from tests.wheel import build_wheel

MODEL = "tiny-offline"
ARCH = ASSET.removeprefix(f"llama-{TAG}-bin-ubuntu-").removesuffix(".tar.gz")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(3 * WAIT_S),
    pytest.mark.usefixtures("llama_server"),
]


async def _llmgw(*args: str) -> str:
    """`llmgw ARGS` in a process of its own, as a person runs it; its stdout, failing the test on an error."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, f"llmgw {' '.join(args)} exited {process.returncode}:\n{err.decode()}"
    return out.decode()


@attrs.frozen
class Certs:
    server: TLSConfig
    mirror: TLSConfig
    node: TLSConfig
    control_plane: TLSConfig


def _certs(pki_dir: Path) -> Certs:
    pki.init_ca(pki_dir)
    ca = str(pki_dir / "ca.pem")

    def tls(pair: tuple[Path, Path]) -> TLSConfig:
        return TLSConfig(ca=ca, cert=str(pair[0]), key=str(pair[1]))

    return Certs(
        server=tls(pki.issue_server(pki_dir, "server", ["127.0.0.1", "localhost"], pki_dir / "server")),
        mirror=tls(pki.issue_server(pki_dir, "mirror", ["127.0.0.1"], pki_dir / "mirror")),
        node=tls(pki.issue_agent(pki_dir, NODE, pki_dir / "node")),
        control_plane=tls(pki.issue_agent(pki_dir, "control-plane", pki_dir / "cp")),
    )


def _state(server: ServerHandle) -> str:
    node = server.inventory.node(NODE)
    lines = [server.inventory.why_no_ready(MODEL)]
    if node is not None:
        lines += [f"install {p.engine} {p.version} {p.state}: {p.detail}" for p in node.provision]
    lines += [f"replica {r.shard_id} {r.state}: {r.detail}" for r in server.inventory.replicas(MODEL)]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _publishers(tmp_path: Path) -> AsyncIterator[tuple[str, str, FakeGitHub, Hub]]:
    """The fake GitHub (the real archive and its digest) and the fake hub (the tiny GGUF), while open."""
    archive, digest = await asyncio.to_thread(_read_build)
    github = FakeGitHub(archive, digest)
    gguf = tmp_path / "tiny.gguf"
    await asyncio.to_thread(_write_tiny_model, gguf)
    hub = Hub(files={"tiny.gguf": await asyncio.to_thread(gguf.read_bytes)}, lfs={"tiny.gguf"})
    async with _serve(github.app()) as github_url, _serve(hub_app(hub)) as hub_url:
        github.url, hub.url = github_url, hub_url
        yield github_url, hub_url, github, hub


async def test_an_offline_site_installs_llama_cpp_and_serves_a_chat_from_the_bundle_alone(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheelhouse"
    await asyncio.to_thread(build_wheel, wheels, tmp_path / "source")
    bundle = tmp_path / "site-bundle.tar"

    # Where the internet is: the publishers answer, and the bundle is made.
    async with _publishers(tmp_path) as (github_url, hub_url, github, hub):
        out = await _llmgw(
            "bundle",
            "create",
            str(bundle),
            "--models",
            "org/model@main",
            "--engines",
            f"llamacpp={TAG}",
            "--arch",
            ARCH,
            "--cpu-only",
            "--tar",
            "--wheelhouse",
            str(wheels),
            "--hf-endpoint",
            hub_url,
            "--release-api",
            github_url,
            "--release-download",
            github_url,
        )
    # Stopped: from here on nothing answers at either address.
    assert [path for _, path, _ in hub.requests] == ["tiny.gguf"]
    asked_before = list(github.requests)
    sha = out.strip().splitlines()[-1].removeprefix("manifest sha256: ")
    assert len(sha) == 64, out
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert f"engines/{REPO}/releases/download/{TAG}/{ASSET}" in names
    assert f"models/org/model/{COMMIT}/tiny.gguf" in names
    assert any(n.startswith("wheels/llmgw-") for n in names)

    # The site: the mirror first (nodes will reach it), then server.yaml, then the import.
    certs = await asyncio.to_thread(_certs, tmp_path / "pki")
    mirror_root = tmp_path / "mirror"
    mirror_cfg = MirrorConfig(
        listen="127.0.0.1:0",
        root=str(mirror_root),
        hf_endpoint=hub_url,
        admin_listen="127.0.0.1:0",
        admin_tls=certs.mirror,
        control_plane="control-plane",
    )
    await asyncio.to_thread(mirror_root.mkdir)
    async with contextlib.AsyncExitStack() as stack:
        mirror = await stack.enter_async_context(mirror_role(mirror_cfg))
        server_yaml = tmp_path / "server.yaml"
        await asyncio.to_thread(
            server_yaml.write_text,
            f"""\
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
state_dir: {tmp_path / "server"}
tls: {{ ca: {certs.server.ca}, cert: {certs.server.cert}, key: {certs.server.key} }}
control:
  interval_s: 0.5
mirror:
  api: {mirror.admin_url}
  url: {mirror.url}
  tls: {{ ca: {certs.server.ca}, cert: {certs.control_plane.cert}, key: {certs.control_plane.key} }}
engines:
  llamacpp: {TAG}
models:
  - name: {MODEL}
    source: mirror:org/model@main
    profiles:
      - engine: llamacpp
        args: [--threads, "2"]
""",
        )
        imported = await _llmgw(
            "bundle",
            "import",
            str(bundle),
            "--sha256",
            sha,
            "--root",
            str(mirror_root),
            "--server-config",
            str(server_yaml),
            "--trust-dir",
            str(tmp_path / "keys"),
        )
        assert f"model  org/model@{COMMIT}" in imported
        server_cfg = await asyncio.to_thread(config.load, ServerConfig, server_yaml)
        assert server_cfg.engine_mirror.base_url == f"{mirror.url}/files/engines"
        assert server_cfg.engine_mirror.checksums == {ASSET: f"sha256:{github.digest}"}

        server = await stack.enter_async_context(server_role(server_cfg))
        agent_yaml = tmp_path / "agent.yaml"
        # The publishers' addresses, as a node copied from an online site would have them: nothing answers.
        await asyncio.to_thread(
            agent_yaml.write_text,
            f"""\
node_id: {NODE}
servers: ["127.0.0.1:{server.agent_port}"]
state_dir: {tmp_path / "agent"}
heartbeat_interval_s: 0.5
ready_timeout_s: {WAIT_S}
keep_engines_on_stop: false
tls: {{ ca: {certs.node.ca}, cert: {certs.node.cert}, key: {certs.node.key} }}
provision:
  api_url: {github_url}
  download_url: {github_url}
""",
        )
        agent_cfg = await asyncio.to_thread(config.load, AgentConfig, agent_yaml)
        await stack.enter_async_context(agent_role(agent_cfg))
        key = await server.create_dev_key()
        await _eventually(
            f"{MODEL} to have a ready replica",
            lambda: bool(server.inventory.ready_endpoints(MODEL)),
            lambda: _state(server),
        )
        node = server.inventory.node(NODE)
        assert node is not None and node.engine_versions["llamacpp"] == TAG
        assert github.requests == asked_before, "a publisher was asked after the bundle was made"
        installed = agent_cfg.engines_dir / "llamacpp" / f"{TAG}-cpu"
        assert await asyncio.to_thread((installed / ".llmgw-installed").is_file)

        client = openai.AsyncOpenAI(base_url=f"{server.gateway_url}/v1", api_key=key)
        async with client:
            reply = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
            )
        assert reply.model == MODEL
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8
