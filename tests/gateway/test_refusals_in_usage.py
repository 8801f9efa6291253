"""Every request the gateway refuses is in the stored usage, as `llmgw usage` counts requests and errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.gateway.admission import UNKNOWN_MODEL, Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store, open_store
from llmgw.store.quotas import set_limits
from llmgw.store.scopes import Scope
from llmgw.store.usage import usage_totals

from .conftest import MODEL, FakeReplicas
from .test_admission import CHAT, Rig, sim

__all__ = ["sim"]

OTHER = "other-chat"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The usage store, SQLite's and PostgreSQL's: each counts a refusal the same way."""
    sqlite = request.param == "sqlite"
    where = str(tmp_path / "llmgw.db") if sqlite else request.getfixturevalue("postgres_url")
    async with open_store(where) as opened:
        yield opened


@pytest.fixture
async def gw(store: Store, sim: str) -> AsyncIterator[Rig]:
    """A gateway with admission in front of the sim, serving MODEL and OTHER."""
    cfg = ServerConfig(models=[ModelConfig(name=MODEL), ModelConfig(name=OTHER)])
    keys, recorder = KeyCache(), UsageRecorder()
    quotas = Quotas(recorder)
    catalog = Catalog(cfg)
    replicas = FakeReplicas(endpoints={MODEL: [sim], OTHER: [sim]})
    app = make_gateway_app(cfg, catalog, replicas, keys, Admission(cfg, catalog, quotas, recorder))
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        yield Rig(client, store, keys, quotas, recorder)


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


async def test_every_refusal_of_a_key_is_a_request_and_an_error_in_the_usage(gw: Rig, store: Store) -> None:
    allowed, _ = await gw.key("allowed", models=[MODEL])
    limited, limited_key = await gw.key("limited")
    await set_limits(store, Scope("key", limited_key.id), rpm=1, tpm=None)
    await gw.reload()

    async def post(key: str, body: dict[str, Any], path: str = CHAT) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        async with gw.client.post(path, data=json.dumps(body), headers=headers) as r:
            return r.status

    # The key's list (403), too many tokens (400), a body that is no Messages body (400), a model of
    # another kind (400), the rpm (429); and one request served.
    assert await post(allowed, _chat(model=OTHER)) == 403
    assert await post(allowed, _chat(max_tokens=10**6)) == 400
    assert await post(allowed, {"model": MODEL, "max_tokens": 8, "messages": "hi"}, "/v1/messages") == 400
    assert await post(allowed, {"model": MODEL, "input": "hi"}, "/v1/embeddings") == 400
    assert await post(limited, _chat(max_tokens=8)) == 200
    assert await post(limited, _chat(max_tokens=8)) == 429
    # No key to count it under, or no model: not counted.
    assert await post("sk-llmgw-not-a-key", _chat()) == 401
    async with gw.client.post(CHAT, data=b"{", headers={"Authorization": f"Bearer {allowed}"}) as r:
        assert r.status == 400

    await gw.recorder.flush(store)
    by_model = {t.group: t for t in await usage_totals(store, "model")}
    assert (by_model[OTHER].requests, by_model[OTHER].errors) == (1, 1)
    chat = by_model[MODEL]
    assert (chat.requests, chat.errors) == (5, 4)
    # A refusal cost nothing and used no token.
    assert (chat.prompt_tokens, chat.completion_tokens) == (
        await _tokens_of_the_one_served(store, limited_key.id)
    )
    by_key = {t.group: t for t in await usage_totals(store, "key")}
    assert (by_key[limited_key.id].requests, by_key[limited_key.id].errors) == (2, 1)


async def _tokens_of_the_one_served(store: Store, key_id: int) -> tuple[int, int]:
    by_key = {t.group: t for t in await usage_totals(store, "key")}
    return by_key[key_id].prompt_tokens, by_key[key_id].completion_tokens


async def test_requests_for_made_up_model_names_share_one_usage_row(gw: Rig, store: Store) -> None:
    # A key may name any model; each made-up name a row of its own would let one key grow the usage
    # table without bound with refusals that cost nothing.
    narrow, _ = await gw.key("narrow", models=[MODEL])
    wide, _ = await gw.key("wide")
    await gw.reload()
    made_up = [f"no-such-model-{n}" for n in range(20)]
    for name in made_up:
        for key, status in ((narrow, 403), (wide, 404)):
            headers = {"Authorization": f"Bearer {key}"}
            async with gw.client.post(CHAT, data=json.dumps(_chat(model=name)), headers=headers) as r:
                assert r.status == status

    await gw.recorder.flush(store)
    by_model = {t.group: t for t in await usage_totals(store, "model")}
    assert not set(made_up) & set(by_model)
    unknown = by_model[UNKNOWN_MODEL]
    assert (unknown.requests, unknown.errors) == (40, 40)
    assert (unknown.prompt_tokens, unknown.completion_tokens, unknown.cost) == (0, 0, 0.0)
