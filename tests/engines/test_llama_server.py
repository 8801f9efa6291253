"""A real llama-server, started with the llama.cpp adapter's command line, serves the tiny model.

Needs the build of scripts/build-llama-server.sh in its cache (about 10
minutes once; `make test` builds it before the tests). Without it the tests
fail, saying how to get it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from llmgw.adminapi import bench as benchapi
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.routes import mount
from llmgw.bench.result import Level, Run
from llmgw.catalog import Catalog
from llmgw.cli.ctl import ctl
from llmgw.config import AuthConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder, find_usage
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import open_store
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_by_day
from tests import needs

ROOT = Path(__file__).resolve().parents[2]
BUILD = needs.LLAMA_BUILD

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.usefixtures("llama_server"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight llama model, written once for the module."""
    model = tmp_path_factory.mktemp("model") / "tiny.gguf"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_tiny_gguf.py"),
            "--vocab",
            str(BUILD / "ggml-vocab-llama-spm.gguf"),
            "--out",
            str(model),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    assert model.stat().st_size < 20_000_000
    return model


# One server for the module: starting llama-server takes seconds, and the
# tests only read from it.
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """llama-server serving the tiny model as tiny-chat; yields its base URL."""
    tmp_path = tmp_path_factory.mktemp("llama-server")
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model="tiny-chat",
        port=_free_port(),
        model_path=str(tiny_model),
        context_size=1024,
        binary=str(BUILD / "bin" / "llama-server"),
        args=("--threads", "2"),
    )
    log = tmp_path / "llama-server.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *engine.command(spec),
            env={**os.environ, **engine.environment(spec)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://{spec.host}:{spec.port}"
    try:
        await _wait_healthy(base + engine.health_path, process, log)
        yield base
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


async def _wait_healthy(url: str, process: asyncio.subprocess.Process, log: Path) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            if process.returncode is not None:
                tail = await asyncio.to_thread(_tail, log)
                pytest.fail(f"llama-server exited with {process.returncode}:\n{tail}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            # Polling, not waiting for something to happen: the next probe.
            await asyncio.sleep(0.1)
    tail = await asyncio.to_thread(_tail, log)
    pytest.fail(f"llama-server did not become healthy within 60 s:\n{tail}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


async def test_the_server_answers_to_the_catalog_name_and_reports_metrics(server: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(server + "/v1/models") as resp:
            assert resp.status == 200
            ids = [m["id"] for m in (await resp.json())["data"]]
        async with session.get(server + "/metrics") as resp:
            assert resp.status == 200
            metrics = await resp.text()
    assert ids == ["tiny-chat"]
    assert "llamacpp:" in metrics


async def test_a_chat_completion_comes_back_with_usage(server: str) -> None:
    body = {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(server + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        reply = await resp.json()
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["prompt_tokens"] > 0
    assert 1 <= reply["usage"]["completion_tokens"] <= 8


async def test_a_streamed_chat_completion_ends_with_a_usage_chunk(server: str) -> None:
    body = {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(server + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                chunks.append(json.loads(line.removeprefix("data: ")))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] > 0
    assert 1 <= usage["completion_tokens"] <= 8
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks[:-1])


# What differs between two calls to llama-server: the id, the time, and its timings (how long it took).
_PER_CALL = re.compile(rb'"(id|created)":("[^"]*"|\d+)|"timings":\{[^{}]*\}')


def _normalised(stream: bytes) -> bytes:
    return _PER_CALL.sub(lambda m: m[0].split(b":", 1)[0] + b':"-"', stream)


async def test_a_stream_through_the_gateway_without_usage_is_the_engines_bytes_and_charged_its_count(
    server: str, tmp_path: Path
) -> None:
    body = {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": "Hello there, how are you?"}],
        "max_tokens": 6,
        "temperature": 0,
        "seed": 1,
        "stream": True,
    }
    recorder = UsageRecorder()
    async with open_store(tmp_path / "llmgw.db") as store:
        plaintext, _ = await create_key(store, "k")
        keys = KeyCache()
        await keys.refresh(store)
        cfg = ServerConfig(models=[ModelConfig(name="tiny-chat")])
        catalog = Catalog(cfg)
        quotas = Quotas(recorder)
        await quotas.refresh(store)
        app = make_gateway_app(
            cfg, catalog, _OneEngine(server), keys, Admission(cfg, catalog, quotas, recorder)
        )
        async with (
            TestClient(TestServer(app, host="127.0.0.1", port=0)) as gateway,
            _fresh_connections() as s,
        ):
            async with gateway.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {plaintext}"}
            ) as resp:
                assert resp.status == 200
                through = await resp.read()
            async with s.post(server + "/v1/chat/completions", json=body) as resp:
                direct = await resp.read()
            asked = {**body, "stream_options": {"include_usage": True}}
            async with s.post(server + "/v1/chat/completions", json=asked) as resp:
                counted = find_usage(await resp.read())
        await recorder.flush(store)
        (row,) = await usage_by_day(store)
    # The client's bytes are the engine's, ids, times and timings aside; timings stay in the finish chunk.
    assert _normalised(through) == _normalised(direct)
    assert b'"usage"' not in through and b'"timings"' in through
    assert counted is not None and (row.prompt_tokens, row.completion_tokens) == counted


def _fresh_connections() -> aiohttp.ClientSession:
    # llama-server may close a connection after a stream; a pooled one would then fail the next call.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


@attrs.define
class _OneEngine:
    endpoint: str

    def ready_endpoints(self, model: str) -> list[str]:
        return [self.endpoint]

    def why_no_ready(self, model: str) -> str:
        return "none"

    def route(self, endpoint: str) -> None:
        return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bench_run(server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `llmgw ctl bench --json` at concurrency 1 and 4, a second each, through a gateway."""
    tmp_path = tmp_path_factory.mktemp("bench")
    return await _bench(server, tmp_path, "--concurrency", "1,4", "--seconds", "1", "--max-tokens", "8")


async def test_ctl_bench_through_the_gateway_reads_the_engines_own_queue_and_no_kv_cache(
    bench_run: dict[str, Any],
) -> None:
    """Every field at each level, replies streamed, and llama-server's load read from its own metrics."""
    assert set(bench_run) == {f.name for f in attrs.fields(Run)}
    assert bench_run["engines"] == ["llamacpp"]
    assert [level["concurrency"] for level in bench_run["levels"]] == [1, 4]
    for level in bench_run["levels"]:
        assert set(level) == {f.name for f in attrs.fields(Level)}
        assert level["requests"] > 0 and level["output_tokens"] > 0
        assert level["ttft_p50_ms"] is not None and level["engine_readings"] >= 1
        # The tokens are llama-server's own usage: its chat template makes 16 words more tokens.
        assert level["requests_without_usage"] == 0
        assert level["input_tokens"] > 16 * level["requests"]
        assert level["tpot_p50_ms"] is not None and level["e2e_p99_ms"] is not None
        # llamacpp:requests_deferred is on its page; a KV-cache gauge is not (this build dropped
        # llamacpp:kv_cache_usage_ratio), so the cache reads "not reported", never an idle 0.
        assert level["queue_depth_max"] is not None and level["queue_depth_max"] >= 0
        assert level["kv_cache_max"] is None


async def test_ctl_bench_through_the_gateway_gets_no_errors_from_llama_server(
    bench_run: dict[str, Any],
) -> None:
    assert [(level["errors"], level["error"]) for level in bench_run["levels"]] == [(0, ""), (0, "")]


async def _bench(endpoint: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run `llmgw ctl bench tiny-chat --json` through a gateway and admin API in front of endpoint."""
    shard = pb.ShardStatus(
        shard_id="tiny-chat-1", model="tiny-chat", engine="llamacpp", state="ready", endpoint=endpoint
    )
    inventory = Inventory(5.0)
    inventory.attach(
        pb.Register(node_id="n1", engine_versions={"llamacpp": "b1"}, running=[shard]), "127.0.0.1:1"
    )
    cfg = ServerConfig(
        models=[ModelConfig(name="tiny-chat", replicas=1, profiles=[ProfileConfig(engine="llamacpp")])],
        state_dir=str(tmp_path / "state"),
        # No keys: what is measured is the engine, and a store for one key is beside the point.
        auth=AuthConfig(enabled=False),
    )
    catalog = Catalog(cfg)
    admin_app = web.Application()
    adminapi.install(admin_app, cfg, inventory, catalog)
    mount(admin_app, benchapi.ROUTES)
    async with (
        TestServer(
            make_gateway_app(cfg, catalog, inventory, KeyCache()), host="127.0.0.1", port=0
        ) as gateway,
        TestServer(admin_app, host="127.0.0.1", port=0) as admin,
    ):
        argv = [
            "--server", f"http://127.0.0.1:{admin.port}", "bench", "tiny-chat",
            "--gateway", f"http://127.0.0.1:{gateway.port}", "--prompt-tokens", "16", "--json", *args,
        ]  # fmt: skip
        result = await asyncio.to_thread(CliRunner().invoke, ctl, argv, catch_exceptions=False)
    assert (result.exit_code, result.stderr) == (0, ""), result.stdout
    run: dict[str, Any] = json.loads(result.stdout)
    return run
