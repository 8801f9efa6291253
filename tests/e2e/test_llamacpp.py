"""A real llama.cpp engine end to end: installed by the agent, serving a GGUF model through the gateway.

Everything a production node does, on loopback: the server and the agent
roles (real certificates, mutual TLS), a stand-in for GitHub's release pages
serving the llama-server archive that scripts/build-llama-server.sh packs and
its digest, the agent's real installer (download, checksum, unpack, ldd,
--version), the weights fetched over HTTP into the agent's cache, the model
placed on the node, and the official openai client asking the gateway.

Needs the build in ${LLMGW_BUILD_CACHE:-~/.cache/llmgw/llama-server}/11434/;
`make test` builds it first (about 10 minutes once); a bare `pytest` on a
machine that never built it fails these tests, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import platform
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import attrs
import openai
import psutil
import pytest
from aiohttp import web

from llmgw import config, pki
from llmgw.config import AgentConfig, ServerConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.server import ServerHandle, server_role
from llmgw.store.usage import usage_by_day

ROOT = Path(__file__).resolve().parents[2]
VERSION = "11434"
TAG = f"b{VERSION}"
REPO = "ggml-org/llama.cpp"
CACHE = Path(os.environ.get("LLMGW_BUILD_CACHE", Path.home() / ".cache" / "llmgw" / "llama-server")) / VERSION
ASSET = f"llama-{TAG}-bin-ubuntu-{'arm64' if platform.machine() in ('aarch64', 'arm64') else 'x64'}.tar.gz"
ARCHIVE = CACHE / ASSET
VOCAB = CACHE / "ggml-vocab-llama-spm.gguf"
MODEL = "tiny-llama"
NODE = "cpu-01"
# Installing (a 7 MB archive), fetching 5 MB of weights and loading them take
# seconds; a CI machine with two busy cores gets room.
WAIT_S = 180.0
# Not llama.cpp's default (1) nor llmgw's (4): seen on the command line, it came from agent.yaml.
PARALLEL = 3

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(2 * WAIT_S),
    pytest.mark.usefixtures("llama_server"),
]


@attrs.define
class FakeGitHub:
    """GitHub's release API and downloads for one llama.cpp release, and what was asked of them."""

    archive: bytes
    digest: str
    url: str = ""
    requests: list[str] = attrs.Factory(list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/repos/{owner}/{repo}/releases/tags/{tag}", self._release)
        app.router.add_get("/{owner}/{repo}/releases/download/{tag}/{asset}", self._asset)
        return app

    def _ours(self, request: web.Request) -> bool:
        info = request.match_info
        return f"{info['owner']}/{info['repo']}" == REPO and info["tag"] == TAG

    async def _release(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        if not self._ours(request):
            return web.json_response({"message": "Not Found"}, status=404)
        asset = {"name": ASSET, "size": len(self.archive), "digest": f"sha256:{self.digest}"}
        return web.json_response({"tag_name": TAG, "assets": [asset]})

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        if not self._ours(request) or request.match_info["asset"] != ASSET:
            return web.Response(status=404)
        return web.Response(body=self.archive, content_type="application/octet-stream")


@attrs.define
class System:
    server: ServerHandle
    github: FakeGitHub
    key: str
    engines_dir: Path
    weights_dir: Path
    source: str


@contextlib.asynccontextmanager
async def _serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def _read_build() -> tuple[bytes, str]:
    archive = ARCHIVE.read_bytes()
    # The digest published beside the archive, in sha256sum's format, as a release carries it.
    digest = Path(f"{ARCHIVE}.sha256").read_text().split()[0]
    assert hashlib.sha256(archive).hexdigest() == digest, f"{ARCHIVE} does not match its .sha256"
    return archive, digest


def _make_pki(pki_dir: Path) -> None:
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1", "localhost"], pki_dir)
    pki.issue_agent(pki_dir, NODE, pki_dir)


def _write_tiny_model(out: Path) -> str:
    """The tiny random-weight llama GGUF (scripts/make_tiny_gguf.py); its sha256."""
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_tiny_gguf.py"),
            "--vocab",
            str(VOCAB),
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return hashlib.sha256(out.read_bytes()).hexdigest()


async def _eventually(
    what: str, check: Callable[[], Awaitable[bool] | bool], explain: Callable[[], str]
) -> None:
    """Poll check until it holds; fail after WAIT_S saying what was awaited and how things stand."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if loop.time() > deadline:
            pytest.fail(f"timed out after {WAIT_S:g} s waiting for {what}: {explain()}")
        # Polling what no event announces: another process's progress.
        await asyncio.sleep(0.2)


def _state(server: ServerHandle) -> str:
    node = server.inventory.node(NODE)
    lines = [server.inventory.why_no_ready(MODEL)]
    if node is not None:
        lines += [f"engines {node.engine_versions}"]
        lines += [f"install {p.engine} {p.version} {p.state}: {p.detail}" for p in node.provision]
    for replica in server.inventory.replicas(MODEL):
        lines.append(f"replica {replica.shard_id} {replica.state}: {replica.detail}")
    return "\n".join(lines)


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[System]:
    """Server and agent on loopback, the fake GitHub and a weights host; yields once MODEL is ready."""
    archive, digest = await asyncio.to_thread(_read_build)
    pki_dir = tmp_path / "pki"
    await asyncio.to_thread(_make_pki, pki_dir)
    weights_dir = tmp_path / "models"
    weights_dir.mkdir()
    model_sha = await asyncio.to_thread(_write_tiny_model, weights_dir / "tiny.gguf")
    github = FakeGitHub(archive, digest)
    weights_app = web.Application()
    weights_app.router.add_static("/models/", weights_dir)
    async with contextlib.AsyncExitStack() as stack:
        github.url = await stack.enter_async_context(_serve(github.app()))
        weights_url = await stack.enter_async_context(_serve(weights_app))
        source = f"{weights_url}/models/tiny.gguf"
        server_yaml = tmp_path / "server.yaml"
        server_yaml.write_text(
            f"""\
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
state_dir: {tmp_path / "server"}
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / "server.pem"}
  key: {pki_dir / "server-key.pem"}
control:
  interval_s: 0.5
engines:
  llamacpp: {TAG}
models:
  - name: {MODEL}
    source: {source}
    sha256:
      tiny.gguf: {model_sha}
    profiles:
      - engine: llamacpp
        args: [--threads, "2"]
"""
        )
        server = await stack.enter_async_context(
            server_role(await asyncio.to_thread(config.load, ServerConfig, server_yaml))
        )
        agent_yaml = tmp_path / "agent.yaml"
        agent_yaml.write_text(
            f"""\
node_id: {NODE}
servers: ["127.0.0.1:{server.agent_port}"]
state_dir: {tmp_path / "agent"}
heartbeat_interval_s: 0.5
ready_timeout_s: {WAIT_S}
keep_engines_on_stop: false
engines:
  llamacpp:
    parallel: {PARALLEL}
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / f"{NODE}.pem"}
  key: {pki_dir / f"{NODE}-key.pem"}
provision:
  api_url: {github.url}
  download_url: {github.url}
"""
        )
        agent_cfg = await asyncio.to_thread(config.load, AgentConfig, agent_yaml)
        await stack.enter_async_context(agent_role(agent_cfg))
        key = await server.create_dev_key()
        await _eventually(
            f"{MODEL} to have a ready replica",
            lambda: bool(server.inventory.ready_endpoints(MODEL)),
            lambda: _state(server),
        )
        yield System(
            server=server,
            github=github,
            key=key,
            engines_dir=agent_cfg.engines_dir,
            weights_dir=agent_cfg.weights_dir,
            source=source,
        )


async def test_the_agent_installs_llama_server_from_the_release_and_checks_it_runs(system: System) -> None:
    assert system.github.requests[:2] == [
        f"/repos/{REPO}/releases/tags/{TAG}",
        f"/{REPO}/releases/download/{TAG}/{ASSET}",
    ]
    node = system.server.inventory.node(NODE)
    assert node is not None
    assert node.engine_versions["llamacpp"] == TAG
    (status,) = [p for p in node.provision if p.engine == "llamacpp"]
    assert (status.state, status.variant) == ("ready", "cpu")
    # The version line is what the installed binary printed when the installer ran it.
    assert status.detail.startswith(f"llama-server version: 0.6.0-dev (build {VERSION}")
    installed = system.engines_dir / "llamacpp" / f"{TAG}-cpu"
    assert (installed / ".llmgw-installed").is_file()
    (replica,) = system.server.inventory.replicas(MODEL)
    assert (replica.node_id, replica.engine, replica.state) == (NODE, "llamacpp", "ready")
    # The weights a node holds come with its next heartbeat, which may follow the replica's "ready".
    inventory = system.server.inventory
    await _eventually(
        f"{NODE} to report the weights of {system.source}",
        lambda: (n := inventory.node(NODE)) is not None and n.has_weights(system.source),
        lambda: f"it reports {[w.source for w in n.weights] if (n := inventory.node(NODE)) else 'nothing'}",
    )


async def test_the_engine_runs_the_installed_binary_on_the_fetched_weights_with_the_nodes_slots(
    system: System,
) -> None:
    (replica,) = system.server.inventory.replicas(MODEL)
    port = replica.endpoint.rsplit(":", 1)[1]
    (argv,) = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and p.info["cmdline"][0].endswith("llama-server") and port in p.info["cmdline"]
    ]
    assert Path(argv[0]).is_relative_to(system.engines_dir / "llamacpp" / f"{TAG}-cpu")
    assert Path(argv[argv.index("-m") + 1]).is_relative_to(system.weights_dir)
    assert argv[argv.index("--alias") + 1] == MODEL
    assert argv[argv.index("-np") + 1] == str(PARALLEL)
    assert argv[-2:] == ["--threads", "2"]


async def test_the_openai_client_gets_a_chat_completion_and_a_streamed_one_with_usage_counted(
    system: System,
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{system.server.gateway_url}/v1", api_key=system.key)
    async with client:
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
        )
        assert reply.model == MODEL
        assert reply.choices[0].message.role == "assistant"
        assert reply.usage is not None
        assert reply.usage.prompt_tokens > 0 and 1 <= reply.usage.completion_tokens <= 8

        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, streamed_usage, chunks = "", None, 0
        async for chunk in stream:
            chunks += 1
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                streamed_usage = chunk.usage
        assert chunks > 2 and text
        assert streamed_usage is not None
        assert streamed_usage.prompt_tokens > 0 and 1 <= streamed_usage.completion_tokens <= 8

    # The gateway counts what the engine reported, for the non-streamed reply and the stream alike.
    want = (
        2,
        reply.usage.prompt_tokens + streamed_usage.prompt_tokens,
        reply.usage.completion_tokens + streamed_usage.completion_tokens,
    )

    async def counted() -> bool:
        rows = [d for d in await usage_by_day(system.server.store) if d.model == MODEL]
        got = (
            sum(d.requests for d in rows),
            sum(d.prompt_tokens for d in rows),
            sum(d.completion_tokens for d in rows),
        )
        seen.append(got)
        return got == want

    seen: list[tuple[int, int, int]] = []
    await _eventually(
        f"the store to count 2 requests and their tokens {want}", counted, lambda: f"last counted {seen[-1:]}"
    )


async def test_the_admin_api_reads_the_engines_own_metrics_page(system: System) -> None:
    """llama-server was started with --metrics, and the control plane reads the page it serves."""
    client = openai.AsyncOpenAI(base_url=f"{system.server.gateway_url}/v1", api_key=system.key)
    async with client:
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0
        )
    assert reply.usage is not None
    (replica,) = system.server.inventory.replicas(MODEL)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{system.server.admin_url}/api/v1/replicas/{replica.shard_id}/metrics") as got,
    ):
        assert got.status == 200, await got.text()
        body = await got.json()
    assert body["url"] == f"{replica.endpoint}/metrics"
    metrics = body["metrics"]
    assert metrics["llamacpp:tokens_predicted_total"] >= reply.usage.completion_tokens >= 1
    assert "llamacpp:requests_processing" in metrics
