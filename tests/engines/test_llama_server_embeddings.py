"""A real llama-server, started for a model of kind `embeddings`, gives vectors through the gateway.

The engine's command line is the one a node gets (the reconciler's arguments, the llama.cpp
adapter's argv), the model is the tiny random-weight GGUF, and the client is the official openai
one. Skipped, saying how to build it, without the llama-server build in the cache.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ProfileConfig, ServerConfig
from llmgw.control.reconciler import shard_args
from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import open_store
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_by_day

from .test_llama_server import BUILD, _free_port, _OneEngine, _wait_healthy, tiny_model

__all__ = ["tiny_model"]

# The tiny model's GGUF names no pooling, which llama-server's OpenAI route refuses ("pooling type
# 'none'"); a profile says which, as it would for any model converted without one.
PROFILE = ProfileConfig(engine="llamacpp", args=["--threads", "2", "--pooling", "mean"])
MODEL = ModelConfig(
    name="tiny-embed",
    kind="embeddings",
    profiles=[PROFILE],
    pricing=PriceConfig(prompt_per_1k=2.0, completion_per_1k=0.0),
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.usefixtures("llama_server"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def embedder(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """llama-server serving the tiny model as tiny-embed, in its embedding mode; its base URL."""
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model=MODEL.name,
        port=_free_port(),
        model_path=str(tiny_model),
        context_size=512,
        binary=str(BUILD / "bin" / "llama-server"),
        args=tuple(shard_args(MODEL, PROFILE)),
    )
    assert "--embeddings" in engine.command(spec)
    log = tmp_path_factory.mktemp("llama-embed") / "llama-server.log"
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


async def test_the_openai_client_gets_vectors_from_llama_server_through_the_gateway_and_is_charged(
    embedder: str, tmp_path: Path
) -> None:
    recorder = UsageRecorder()
    async with open_store(tmp_path / "llmgw.db") as store:
        plaintext, _ = await create_key(store, "k")
        keys = KeyCache()
        await keys.refresh(store)
        cfg = ServerConfig(models=[MODEL])
        catalog = Catalog(cfg)
        quotas = Quotas(recorder)
        await quotas.refresh(store)
        app = make_gateway_app(
            cfg, catalog, _OneEngine(embedder), keys, Admission(cfg, catalog, quotas, recorder)
        )
        gateway = TestClient(TestServer(app, host="127.0.0.1", port=0))
        async with (
            gateway,
            openai.AsyncOpenAI(base_url=_url(gateway), api_key=plaintext, max_retries=0) as client,
        ):
            reply = await client.embeddings.create(model=MODEL.name, input=["Hello there", "Good night"])
            again = await client.embeddings.create(
                model=MODEL.name, input="Hello there", encoding_format="float"
            )
            with pytest.raises(openai.BadRequestError, match="tiny-embed serves embeddings, not chat"):
                await client.chat.completions.create(
                    model=MODEL.name, messages=[{"role": "user", "content": "hi"}]
                )
        await recorder.flush(store)
        rows = await usage_by_day(store)
    assert [d.index for d in reply.data] == [0, 1]
    first = reply.data[0].embedding
    # The tiny model is 64 wide; the same input gets the same vector whatever the encoding.
    assert len(first) == 64 and len(reply.data[1].embedding) == 64
    assert again.data[0].embedding == pytest.approx(first, abs=1e-4)
    assert reply.usage.prompt_tokens > 0
    (row,) = rows
    # The chat refused for the model's kind is counted too, as a request and an error that used nothing.
    assert (row.requests, row.errors, row.completion_tokens) == (3, 1, 0)
    assert row.prompt_tokens == reply.usage.prompt_tokens + again.usage.prompt_tokens
    assert row.cost == pytest.approx(row.prompt_tokens * 2.0 / 1000)


def _url(gateway: TestClient) -> str:  # type: ignore[type-arg]
    return str(gateway.make_url("/v1"))
