"""Projects of their own: each gets exactly its own limits under load, and calls only its own models."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.tenancy import operations as tenancy

from .conftest import MODEL, FakeReplicas

CHAT = "/v1/chat/completions"
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def sims() -> AsyncIterator[dict[str, list[str]]]:
    """A sim engine for each of the two models."""
    servers = {name: TestServer(make_sim_app(name), host="127.0.0.1", port=0) for name in (MODEL, "other")}
    for server in servers.values():
        await server.start_server()
    yield {name: [f"http://127.0.0.1:{server.port}"] for name, server in servers.items()}
    for server in servers.values():
        await server.close()


class Rig:
    def __init__(self, store: Store, client: Client, keys: KeyCache, quotas: Quotas, recorder: UsageRecorder):
        self.store, self.client, self.keys, self.quotas, self.recorder = store, client, keys, quotas, recorder

    async def project(self, name: str, keys: int = 1) -> list[str]:
        """A project of its own (team and org too) with keys in it; their plaintexts."""
        await tenancy.create(self.store, "org", f"{name}-org")
        await tenancy.create(self.store, "team", f"{name}-team", f"{name}-org")
        project = await tenancy.create(self.store, "project", name, f"{name}-team")
        made = [(await create_key(self.store, f"{name}-{i}", project_id=project.id))[0] for i in range(keys)]
        await self.reload()
        return made

    async def reload(self) -> None:
        await self.keys.refresh(self.store)
        await self.quotas.refresh(self.store)

    async def chat(self, key: str, model: str = MODEL) -> tuple[int, dict[str, Any]]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with self.client.post(CHAT, json=body, headers={"Authorization": f"Bearer {key}"}) as reply:
            return reply.status, await reply.json()

    async def models(self, key: str) -> list[str]:
        async with self.client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}) as reply:
            assert reply.status == 200
            return [m["id"] for m in (await reply.json())["data"]]


@pytest.fixture
async def rig(store: Store, sims: dict[str, list[str]]) -> AsyncIterator[Rig]:
    cfg = ServerConfig(models=[ModelConfig(name=MODEL), ModelConfig(name="other")])
    keys, recorder = KeyCache(), UsageRecorder()
    quotas = Quotas(recorder)
    catalog = Catalog(cfg)
    app = make_gateway_app(
        cfg,
        catalog,
        FakeReplicas(endpoints=sims),
        keys,
        Admission(cfg, catalog, quotas, recorder),
    )
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        yield Rig(store, client, keys, quotas, recorder)


async def test_two_projects_under_concurrent_load_each_get_exactly_their_own_limit(rig: Rig) -> None:
    web_keys = await rig.project("web", keys=2)
    api_keys = await rig.project("api", keys=2)
    await tenancy.set_quota(rig.store, "project:web", rpm=7)
    await tenancy.set_quota(rig.store, "project:api", rpm=11)
    await rig.reload()
    # 40 requests from each project, interleaved, from both of its keys at once.
    asked = [(name, keys[i % 2]) for i in range(40) for name, keys in (("web", web_keys), ("api", api_keys))]
    replies = await asyncio.gather(*(rig.chat(key) for _, key in asked))
    admitted = Counter(name for (name, _), (status, _) in zip(asked, replies, strict=True) if status == 200)
    refused = Counter(name for (name, _), (status, _) in zip(asked, replies, strict=True) if status == 429)
    assert admitted == {"web": 7, "api": 11}
    assert refused == {"web": 33, "api": 29}
    # Each refusal names its own project: neither's traffic counted against the other.
    for (name, _), (status, body) in zip(asked, replies, strict=True):
        if status == 429:
            assert f"rate limit reached for project '{name}'" in body["error"]["message"]
    # And usage counts each project's requests against it alone.
    by_project = Counter[int]()
    for usage_key, totals in rig.recorder.pending():
        if usage_key.status == 200:
            by_project[usage_key.project_id] += totals.requests
    assert by_project == {2: 7, 3: 11}


class TestProjectModels:
    async def test_a_project_limited_to_some_models_refuses_the_others_naming_the_project(
        self, rig: Rig
    ) -> None:
        (key,) = await rig.project("web")
        await tenancy.set_models(rig.store, "web", [MODEL])
        await rig.reload()
        assert (await rig.chat(key))[0] == 200
        status, body = await rig.chat(key, "other")
        assert status == 403
        assert body["error"]["code"] == "model_not_allowed"
        assert (
            "project 'web' (team 'web-team', org 'web-org') allows only sim-chat" in body["error"]["message"]
        )

    async def test_a_keys_own_list_is_checked_against_its_projects(self, rig: Rig, store: Store) -> None:
        await rig.project("web")
        await tenancy.set_models(rig.store, "web", [MODEL])
        key, _ = await create_key(store, "wide", project_id=2, models=[MODEL, "other"])
        await rig.reload()
        status, body = await rig.chat(key, "other")
        assert status == 403 and "allows only sim-chat" in body["error"]["message"]
        assert await rig.models(key) == [MODEL]

    async def test_a_key_narrower_than_its_project_is_held_to_its_own_list(
        self, rig: Rig, store: Store
    ) -> None:
        """A key's list replaced by its project's passed every test: none gave a key less than its project."""
        await rig.project("web")
        await tenancy.set_models(rig.store, "web", [MODEL, "other"])
        key, _ = await create_key(store, "narrow", project_id=2, models=[MODEL])
        await rig.reload()
        assert (await rig.chat(key))[0] == 200
        status, body = await rig.chat(key, "other")
        assert status == 403 and body["error"]["code"] == "model_not_allowed"
        assert "may not use the model 'other' (it may use: sim-chat)" in body["error"]["message"]
        assert await rig.models(key) == [MODEL]

    async def test_v1_models_lists_only_what_the_key_may_call(self, rig: Rig, store: Store) -> None:
        (free,) = await rig.project("open")
        (web,) = await rig.project("web")
        narrow, _ = await create_key(store, "narrow", project_id=2, models=["other"])
        await tenancy.set_models(rig.store, "web", ["other"])
        await rig.reload()
        assert await rig.models(free) == [MODEL, "other"]
        assert await rig.models(web) == ["other"]
        assert await rig.models(narrow) == ["other"]

    async def test_a_project_allowed_no_models_lists_none_and_serves_none(self, rig: Rig) -> None:
        (key,) = await rig.project("web")
        await tenancy.set_models(rig.store, "web", [])
        await rig.reload()
        assert await rig.models(key) == []
        assert (await rig.chat(key))[0] == 403

    async def test_lifting_the_projects_list_lets_every_model_through_again(self, rig: Rig) -> None:
        (key,) = await rig.project("web")
        await tenancy.set_models(rig.store, "web", [MODEL])
        await rig.reload()
        await tenancy.set_models(rig.store, "web", None)
        await rig.reload()
        assert (await rig.chat(key, "other"))[0] == 200
