"""Fallbacks and per-model prices: what the live catalog's definitions change for a request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, PriceConfig, ProfileConfig, ServerConfig
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.pricing import price_of
from llmgw.routes import EngineRoute
from llmgw.store import Store
from llmgw.store.keys import create_key

CHAT = "/v1/chat/completions"
SIM = [ProfileConfig(engine="sim")]
CFG = ServerConfig(
    models=[
        ModelConfig(name="big", profiles=SIM, fallbacks=["missing", "medium", "small"]),
        ModelConfig(name="medium", profiles=SIM),
        ModelConfig(name="small", profiles=SIM),
    ],
    auth=AuthConfig(enabled=False),
)


@attrs.define
class Table:
    endpoints: dict[str, list[str]] = attrs.field(factory=dict)

    def ready_endpoints(self, model: str) -> Sequence[str]:
        return self.endpoints.get(model, [])

    def why_no_ready(self, model: str) -> str:
        return f"{model} has no ready replica: 1 starting on node n1"

    def route(self, endpoint: str) -> EngineRoute | None:
        return None


async def _sim(model: str) -> TestServer:
    server = TestServer(make_sim_app(model), host="127.0.0.1", port=0)
    await server.start_server()
    return server


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, str]]:
    servers = {name: await _sim(name) for name in ("big", "small")}
    yield {name: f"http://127.0.0.1:{s.port}" for name, s in servers.items()}
    for server in servers.values():
        await server.close()


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], Table]]:
    table = Table()
    async with TestClient(TestServer(make_gateway_app(CFG, Catalog(CFG), table, KeyCache()))) as client:
        yield client, table


def _ask(model: str, **more: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **more}


class TestFallbacks:
    async def test_a_model_without_a_ready_replica_is_served_by_its_first_ready_fallback(
        self, gateway, engines: dict[str, str]
    ):
        client, table = gateway
        table.endpoints["small"] = [engines["small"]]
        reply = await client.post(CHAT, json=_ask("big"))
        assert reply.status == 200
        # The engine's own answer, naming its own model; the header says what served the call.
        assert (await reply.json())["model"] == "small"
        assert reply.headers["x-llmgw-model"] == "small"

    async def test_a_streamed_call_falls_back_the_same_way(self, gateway, engines: dict[str, str]):
        client, table = gateway
        table.endpoints["small"] = [engines["small"]]
        reply = await client.post(CHAT, json=_ask("big", stream=True))
        assert reply.status == 200
        assert reply.headers["x-llmgw-model"] == "small"
        body = await reply.text()
        assert '"model": "small"' in body or '"model":"small"' in body
        assert body.rstrip().endswith("data: [DONE]")

    async def test_a_model_with_a_ready_replica_is_served_by_it_and_says_so(
        self, gateway, engines: dict[str, str]
    ):
        client, table = gateway
        table.endpoints["big"] = [engines["big"]]
        table.endpoints["small"] = [engines["small"]]
        reply = await client.post(CHAT, json=_ask("big"))
        assert reply.status == 200
        assert reply.headers["x-llmgw-model"] == "big"
        assert (await reply.json())["model"] == "big"

    async def test_with_no_fallback_ready_either_the_503_names_them(self, gateway):
        client, _ = gateway
        reply = await client.post(CHAT, json=_ask("big"))
        assert reply.status == 503
        assert (await reply.json())["error"]["message"] == (
            "big has no ready replica: 1 starting on node n1; "
            "nor has any of its fallbacks (missing, medium, small)"
        )


class TestPrices:
    def test_a_model_s_own_price_comes_before_the_pricing_entry_and_the_default(self):
        cfg = ServerConfig(
            pricing={"m": PriceConfig(prompt_per_1k=1.0)}, default_price=PriceConfig(prompt_per_1k=9.0)
        )
        own = ModelConfig(name="m", pricing=PriceConfig(prompt_per_1k=0.0, completion_per_1k=0.0))
        assert price_of(cfg, "m", own) == PriceConfig(0.0, 0.0)
        assert price_of(cfg, "m", ModelConfig(name="m")) == PriceConfig(prompt_per_1k=1.0)
        assert price_of(cfg, "other", ModelConfig(name="other")) == PriceConfig(prompt_per_1k=9.0)

    async def test_a_model_added_with_its_own_price_is_charged_that_price(self, store: Store):
        cfg = ServerConfig(auth=AuthConfig(enabled=True))
        catalog = Catalog(cfg)
        await catalog.add(
            "name: priced\nprofiles:\n  - engine: sim\npricing:\n  prompt_per_1k: 1000\n"
            "  completion_per_1k: 2000\n",
            "priced.yaml",
        )
        engine = await _sim("priced")
        recorder = UsageRecorder()
        quotas = Quotas(recorder)
        keys = KeyCache()
        plaintext, _ = await create_key(store, "k")
        await keys.refresh(store)
        table = Table({"priced": [f"http://127.0.0.1:{engine.port}"]})
        app = make_gateway_app(cfg, catalog, table, keys, Admission(cfg, catalog, quotas, recorder))
        try:
            async with TestClient(TestServer(app)) as client:
                reply = await client.post(
                    CHAT, json=_ask("priced"), headers={"Authorization": f"Bearer {plaintext}"}
                )
                usage = (await reply.json())["usage"]
        finally:
            await engine.close()
        ((key, totals),) = recorder.pending()
        assert key.model == "priced"
        assert totals.cost == pytest.approx(usage["prompt_tokens"] * 1 + usage["completion_tokens"] * 2)
