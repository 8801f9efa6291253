"""POST /v1/embeddings through the whole pipeline, against the sim engine, with the official openai client."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import AsyncIterator

import attrs
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.engines.sim_server import EMBEDDING_DIM, embedding, make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.checks import MAX_EMBEDDING_INPUTS
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_by_day
from llmgw.tenancy import operations as tenancy

from .conftest import MODEL, FakeReplicas

EMBED = "sim-embed"


@attrs.define
class Rig:
    client: TestClient[web.Request, web.Application]
    store: Store
    keys: KeyCache
    quotas: Quotas
    recorder: UsageRecorder
    key: str

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=str(self.client.make_url("/v1")), api_key=self.key, max_retries=0)

    async def reload(self) -> None:
        await self.keys.refresh(self.store)
        await self.quotas.refresh(self.store)


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[Rig]:
    servers = {name: TestServer(make_sim_app(name), host="127.0.0.1", port=0) for name in (MODEL, EMBED)}
    for server in servers.values():
        await server.start_server()
    cfg = ServerConfig(
        models=[ModelConfig(name=MODEL), ModelConfig(name=EMBED, kind="embeddings")],
        pricing={EMBED: PriceConfig(prompt_per_1k=1.0, completion_per_1k=0.0)},
    )
    catalog = Catalog(cfg)
    keys, recorder = KeyCache(), UsageRecorder()
    quotas = Quotas(recorder)
    endpoints = {name: [f"http://127.0.0.1:{server.port}"] for name, server in servers.items()}
    app = make_gateway_app(
        cfg, catalog, FakeReplicas(endpoints=endpoints), keys, Admission(cfg, catalog, quotas, recorder)
    )
    plaintext, _ = await create_key(store, "k")
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        rig = Rig(client, store, keys, quotas, recorder, plaintext)
        await rig.reload()
        yield rig
    for server in servers.values():
        await server.close()


async def test_the_openai_client_gets_the_sims_deterministic_vectors_through_the_gateway(rig: Rig) -> None:
    async with rig.openai() as client:
        # The client asks for base64 by default and decodes it; the vectors are the sim's own.
        reply = await client.embeddings.create(model=EMBED, input=["hello world", "another"])
        again = await client.embeddings.create(model=EMBED, input="hello world", encoding_format="float")
    assert [d.index for d in reply.data] == [0, 1]
    first = reply.data[0].embedding
    assert len(first) == EMBEDDING_DIM
    assert first == pytest.approx(embedding("hello world"), abs=1e-6)
    assert again.data[0].embedding == pytest.approx(first, abs=1e-6)
    assert reply.data[1].embedding != pytest.approx(first, abs=1e-3)
    assert math.isclose(math.fsum(v * v for v in first), 1.0, rel_tol=1e-5)
    assert reply.usage.prompt_tokens == 3 and reply.usage.total_tokens == 3


async def test_token_ids_are_embedded_and_counted_one_token_each(rig: Rig) -> None:
    async with rig.openai() as client:
        reply = await client.embeddings.create(model=EMBED, input=[[1, 2, 3], [4]], encoding_format="float")
    assert reply.usage.prompt_tokens == 4
    assert reply.data[1].embedding == pytest.approx(embedding([4]), abs=1e-9)


async def test_usage_and_cost_are_the_engines_count_at_the_models_price(rig: Rig) -> None:
    async with rig.openai() as client:
        await client.embeddings.create(model=EMBED, input="one two three four")
    await rig.recorder.flush(rig.store)
    (row,) = await usage_by_day(rig.store)
    assert (row.model, row.requests, row.prompt_tokens, row.completion_tokens) == (EMBED, 1, 4, 0)
    assert row.cost == pytest.approx(4 / 1000)


async def test_an_embeddings_request_counts_against_the_keys_limits_and_budget(rig: Rig) -> None:
    await tenancy.set_quota(rig.store, "project:default", rpm=2)
    await rig.reload()
    async with rig.openai() as client:
        await client.embeddings.create(model=EMBED, input="a")
        await client.embeddings.create(model=EMBED, input="b")
        with pytest.raises(openai.RateLimitError, match="rate limit reached for project 'default'"):
            await client.embeddings.create(model=EMBED, input="c")
    await tenancy.clear_quota(rig.store, "project:default")
    # What a request reserves is its input at the model's price: past what is left, it is refused.
    await tenancy.set_quota(rig.store, "project:default", budget=0.1, period="total")
    await rig.reload()
    async with rig.openai() as client:
        with pytest.raises(openai.RateLimitError, match="has too little left"):
            await client.embeddings.create(model=EMBED, input="d")


async def test_a_chat_model_asked_for_embeddings_is_a_400_saying_what_it_serves(rig: Rig) -> None:
    async with rig.openai() as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.embeddings.create(model=MODEL, input="hello")
    message = refused.value.body["message"]  # type: ignore[index]
    assert message == (
        f"{MODEL} serves chat, not embeddings: send it to /v1/chat/completions, /v1/completions, "
        "/v1/messages, /v1/messages/count_tokens or /v1/responses; "
        f"the models that serve embeddings are {EMBED}"
    )
    await rig.recorder.flush(rig.store)
    # Counted as every refusal is: a request and an error, nothing used.
    (row,) = await usage_by_day(rig.store)
    assert (row.model, row.requests, row.errors, row.prompt_tokens, row.cost) == (MODEL, 1, 1, 0, 0.0)


async def test_an_embeddings_model_asked_for_chat_is_a_400_saying_what_it_serves(rig: Rig) -> None:
    async with rig.openai() as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model=EMBED, prompt="hi")
    assert refused.value.code == "wrong_model_kind"
    assert f"{EMBED} serves embeddings, not chat: send it to /v1/embeddings" in str(refused.value)


async def test_a_key_limited_to_other_models_may_not_embed(rig: Rig, store: Store) -> None:
    narrow, _ = await create_key(store, "narrow", models=[MODEL])
    await rig.reload()
    async with openai.AsyncOpenAI(
        base_url=str(rig.client.make_url("/v1")), api_key=narrow, max_retries=0
    ) as client:
        with pytest.raises(openai.PermissionDeniedError, match="may not use the model 'sim-embed'"):
            await client.embeddings.create(model=EMBED, input="hello")


async def test_the_sim_sends_base64_as_little_endian_float32(rig: Rig) -> None:
    async with rig.client.post(
        "/v1/embeddings",
        json={"model": EMBED, "input": "hello", "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {rig.key}"},
    ) as reply:
        body = await reply.json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert list(struct.unpack(f"<{EMBEDDING_DIM}f", raw)) == pytest.approx(embedding("hello"), abs=1e-6)


@pytest.mark.parametrize("bad", ["", [], [""], [[1], "x", 3], {"text": "x"}, [[]], [True]])
async def test_the_sim_refuses_an_input_it_cannot_embed(rig: Rig, bad: object) -> None:
    async with rig.client.post(
        "/v1/embeddings", json={"model": EMBED, "input": bad}, headers={"Authorization": f"Bearer {rig.key}"}
    ) as reply:
        assert reply.status == 400
        assert "input must be" in (await reply.json())["error"]["message"]


async def test_a_request_of_more_inputs_than_the_bound_is_refused_in_words_before_anything_is_reserved(
    rig: Rig,
) -> None:
    """One request of 200,000 inputs held the engine until the agent killed it."""
    headers = {"Authorization": f"Bearer {rig.key}"}
    many = {"model": EMBED, "input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}
    async with rig.client.post("/v1/embeddings", json=many, headers=headers) as reply:
        assert reply.status == 400
        error = (await reply.json())["error"]
    assert (error["code"], error["param"]) == ("too_many_inputs", "input")
    assert error["message"] == (
        f"input holds {MAX_EMBEDDING_INPUTS + 1:,} inputs; a request may hold at most "
        f"{MAX_EMBEDDING_INPUTS:,}: send them in several requests"
    )
    # Counted as every refusal is: a request and an error, nothing used.
    ((refused, totals),) = rig.recorder.pending()
    assert (refused.status, totals.requests, totals.prompt_tokens, totals.cost) == (400, 1, 0, 0.0)
    # As many as the bound are embedded; so is one input of more token ids than that.
    for taken in (["x"] * MAX_EMBEDDING_INPUTS, list(range(MAX_EMBEDDING_INPUTS + 1))):
        async with rig.client.post(
            # base64: 2,048 vectors as floats are past the megabyte aiohttp warns of.
            "/v1/embeddings",
            json={"model": EMBED, "input": taken, "encoding_format": "base64"},
            headers=headers,
        ) as reply:
            assert reply.status == 200, await reply.text()
