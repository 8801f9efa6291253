"""Admission: exact rate limits on every scope of a key's chain, budgets, settlement and usage."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, PriceConfig, ServerConfig
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.errors import ApiError
from llmgw.gateway.prompts import prompt_bound
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder, find_usage
from llmgw.maxima import MAX_BUDGET, MAX_PRICE_PER_1K
from llmgw.pricing import budget_warnings
from llmgw.store import Store
from llmgw.store.keys import KeyRecord, create_key
from llmgw.store.quotas import Budget, set_budget, set_limits
from llmgw.store.scopes import Scope, create_project
from llmgw.store.usage import usage_by_day

from .conftest import MODEL, FakeReplicas

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8}


@attrs.define
class Rig:
    client: TestClient[web.Request, web.Application]
    store: Store
    keys: KeyCache
    quotas: Quotas
    recorder: UsageRecorder

    async def key(self, name: str = "k", **kwargs: Any) -> tuple[str, KeyRecord]:
        plaintext, record = await create_key(self.store, name, **kwargs)
        await self.keys.refresh(self.store)
        return plaintext, record

    async def reload(self) -> None:
        await self.quotas.refresh(self.store)

    async def chat(self, key: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], bytes]:
        async with self.client.post(
            CHAT, json=body or BODY, headers={"Authorization": f"Bearer {key}"}
        ) as resp:
            return resp.status, dict(resp.headers), await resp.read()


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    server = TestServer(make_sim_app(MODEL), host="127.0.0.1", port=0)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


@pytest.fixture
async def rig(store: Store, sim: str) -> AsyncIterator[RigFactory]:
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(**cfg_changes: Any) -> Rig:
        cfg = ServerConfig(models=[ModelConfig(name=MODEL)], **cfg_changes)
        keys = KeyCache()
        recorder = UsageRecorder()
        quotas = Quotas(recorder, default_rpm=cfg.auth.default_rpm, default_tpm=cfg.auth.default_tpm)
        await quotas.refresh(store)
        catalog = Catalog(cfg)
        app = make_gateway_app(
            cfg,
            catalog,
            FakeReplicas(endpoints={MODEL: [sim]}),
            keys,
            Admission(cfg, catalog, quotas, recorder),
        )
        client = TestClient(TestServer(app, host="127.0.0.1", port=0))
        await client.start_server()
        clients.append(client)
        return Rig(client, store, keys, quotas, recorder)

    yield make
    for client in clients:
        await client.close()


def _reserved(body: dict[str, Any]) -> int:
    """What a request reserves: its prompt's bound (prompts.py) and max_tokens."""
    return prompt_bound(body) + body["max_tokens"]


def _error(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(body)["error"]
    return error


class TestRateLimits:
    async def test_200_concurrent_requests_on_a_key_with_rpm_60_admit_exactly_60(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        plaintext, key = await gw.key()
        await set_limits(gw.store, Scope("key", key.id), rpm=60, tpm=None)
        await gw.reload()
        results = await asyncio.gather(*(gw.chat(plaintext) for _ in range(200)))
        statuses = sorted(status for status, _, _ in results)
        assert statuses.count(200) == 60 and statuses.count(429) == 140

    async def test_a_refusal_names_the_scope_and_says_when_to_come_back(self, rig: RigFactory) -> None:
        gw = await rig()
        plaintext, _ = await gw.key()
        await set_limits(gw.store, Scope("team", 1), rpm=2, tpm=None)
        await gw.reload()
        assert [(await gw.chat(plaintext))[0] for _ in range(2)] == [200, 200]
        status, headers, body = await gw.chat(plaintext)
        assert status == 429
        error = _error(body)
        assert error["code"] == "rate_limit_exceeded"
        assert (
            "rate limit reached for team 'default' (org 'default'): 2 requests per minute" in error["message"]
        )
        assert headers["x-ratelimit-limit-requests"] == "2"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-reset-requests"].endswith("s")
        assert 1 <= int(headers["Retry-After"]) <= 60

    async def test_every_scope_of_the_chain_is_reserved_so_one_projects_keys_share_its_limit(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        project = await create_project(gw.store, 1, "shared")
        first, _ = await gw.key("a", project_id=project.id)
        second, _ = await gw.key("b", project_id=project.id)
        elsewhere, _ = await gw.key("c")
        await set_limits(gw.store, Scope("project", project.id), rpm=3, tpm=None)
        await gw.reload()
        statuses = [(await gw.chat(k))[0] for k in (first, second, first, second)]
        assert statuses == [200, 200, 200, 429]
        assert (await gw.chat(elsewhere))[0] == 200

    async def test_the_default_rpm_applies_only_to_a_key_no_scope_limits(self, rig: RigFactory) -> None:
        gw = await rig(auth=AuthConfig(default_rpm=1))
        free, _ = await gw.key("free")
        limited, record = await gw.key("limited")
        await set_limits(gw.store, Scope("key", record.id), rpm=3, tpm=None)
        await gw.reload()
        assert [(await gw.chat(free))[0] for _ in range(2)] == [200, 429]
        assert [(await gw.chat(limited))[0] for _ in range(4)] == [200, 200, 200, 429]

    async def test_a_key_that_limits_only_tokens_still_has_the_default_rpm_counted_once(
        self, rig: RigFactory
    ) -> None:
        gw = await rig(auth=AuthConfig(default_rpm=2))
        plaintext, record = await gw.key()
        await set_limits(gw.store, Scope("key", record.id), rpm=None, tpm=10**6)
        await gw.reload()
        assert [(await gw.chat(plaintext))[0] for _ in range(3)] == [200, 200, 429]

    async def test_a_limit_of_zero_refuses_everything(self, rig: RigFactory) -> None:
        gw = await rig()
        plaintext, record = await gw.key()
        await set_limits(gw.store, Scope("key", record.id), rpm=None, tpm=0)
        await gw.reload()
        status, headers, _ = await gw.chat(plaintext)
        assert status == 429 and headers["x-ratelimit-limit-tokens"] == "0"

    async def test_tokens_are_reserved_at_admission_and_settled_to_the_reported_usage(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        plaintext, key = await gw.key()
        # Each request reserves its prompt's bound (its text and the template's allowances) and
        # max_tokens=8 (about 170), but uses far fewer; settlement gives the difference back.
        await set_limits(gw.store, Scope("key", key.id), rpm=None, tpm=700)
        await gw.reload()
        status, _, body = await gw.chat(plaintext)
        usage = json.loads(body)["usage"]
        assert status == 200 and usage["total_tokens"] < 40
        concurrent = await asyncio.gather(*(gw.chat(plaintext) for _ in range(20)))
        admitted = sum(1 for status, _, _ in concurrent if status == 200)
        refused = [h for status, h, _ in concurrent if status == 429]
        assert refused and admitted >= 1
        assert refused[0]["x-ratelimit-limit-tokens"] == "700"
        # Everything admitted fits in tpm once settled.
        assert (admitted + 1) * usage["total_tokens"] <= 700

    async def test_a_streamed_reply_is_settled_from_its_final_usage_chunk(self, rig: RigFactory) -> None:
        gw = await rig(pricing={MODEL: PriceConfig(prompt_per_1k=1000.0, completion_per_1k=1000.0)})
        plaintext, _ = await gw.key()
        body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
        status, _, raw = await gw.chat(plaintext, body)
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        usage = find_usage(raw)
        assert usage is not None
        await gw.recorder.flush(gw.store)
        (row,) = await usage_by_day(gw.store)
        assert (row.prompt_tokens, row.completion_tokens) == usage
        assert row.cost == pytest.approx(float(sum(usage)))

    async def test_the_openai_client_raises_rate_limit_error_with_the_retry_after_it_was_given(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        plaintext, key = await gw.key()
        await set_limits(gw.store, Scope("key", key.id), rpm=1, tpm=None)
        await gw.reload()
        client = openai.AsyncOpenAI(api_key=plaintext, base_url=str(gw.client.make_url("/v1")), max_retries=0)
        async with client:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(openai.RateLimitError) as caught:
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}]
                )
        retry_after = caught.value.response.headers["retry-after"]
        assert 1 <= int(retry_after) <= 60
        assert caught.value.code == "rate_limit_exceeded"
        assert f"key 'k' ({key.prefix}…)" in caught.value.message


class TestBudgets:
    async def test_a_spent_budget_answers_insufficient_quota_naming_the_scope(self, rig: RigFactory) -> None:
        # 1 per token: each request costs its total tokens.
        price = PriceConfig(prompt_per_1k=1000.0, completion_per_1k=1000.0)
        gw = await rig(pricing={MODEL: price})
        plaintext, _ = await gw.key()
        status, _, body = await gw.chat(plaintext)
        each = json.loads(body)["usage"]["total_tokens"]
        # Counted at refresh from what is still waiting for the writer, too. Room for two more
        # requests' reservations, one after the other, and not a third.
        await set_budget(gw.store, Scope("project", 1), 3 * each + _reserved(BODY) - 0.5, "day")
        await gw.reload()
        assert [(await gw.chat(plaintext))[0] for _ in range(3)] == [200, 200, 429]
        assert gw.quotas.spent(Scope("project", 1)) == pytest.approx(3.0 * each)
        status, headers, body = await gw.chat(plaintext)
        error = _error(body)
        assert status == 429 and error["type"] == error["code"] == "insufficient_quota"
        assert (
            "the budget of project 'default' (team 'default', org 'default') has too little left"
            in error["message"]
        )
        assert int(headers["Retry-After"]) >= 1

    async def test_concurrent_requests_cannot_overrun_a_budget(self, rig: RigFactory) -> None:
        gw = await rig(pricing={MODEL: PriceConfig(prompt_per_1k=1000.0, completion_per_1k=1000.0)})
        plaintext, _ = await gw.key()
        await set_budget(gw.store, Scope("org", 1), 2000.0, "total")
        await gw.reload()
        results = await asyncio.gather(*(gw.chat(plaintext) for _ in range(50)))
        admitted = [json.loads(body)["usage"]["total_tokens"] for status, _, body in results if status == 200]
        # A reservation is at least what a request can use, so what was admitted settles within it.
        assert 0 < len(admitted) < 50
        assert sum(admitted) <= 2000

    async def test_spending_counted_before_a_restart_still_counts_after_it(self, rig: RigFactory) -> None:
        price = PriceConfig(prompt_per_1k=1000.0, completion_per_1k=1000.0)
        gw = await rig(pricing={MODEL: price})
        plaintext, _ = await gw.key()
        await set_budget(gw.store, Scope("key", 1), 1000.0, "month")
        await gw.reload()
        assert (await gw.chat(plaintext))[0] == 200
        spent = gw.quotas.spent(Scope("key", 1))
        await gw.recorder.flush(gw.store)
        # A new gateway on the same store: what it counts comes from the usage table.
        again = await rig(pricing={MODEL: price})
        assert again.quotas.spent(Scope("key", 1)) == pytest.approx(spent)

    async def test_at_the_dearest_prices_a_long_prompt_costs_a_finite_amount(self, rig: RigFactory) -> None:
        """A price of 1e308 made a long prompt cost inf: "this request may cost up to inf"."""
        dearest = PriceConfig(prompt_per_1k=MAX_PRICE_PER_1K, completion_per_1k=MAX_PRICE_PER_1K)
        gw = await rig(pricing={MODEL: dearest})
        plaintext, key = await gw.key()
        long = {**BODY, "messages": [{"role": "user", "content": "word " * 100_000}]}
        await set_budget(gw.store, Scope("key", key.id), MAX_BUDGET, "total")
        await gw.reload()
        status, _, body = await gw.chat(plaintext, long)
        assert status == 200
        frugal, other = await gw.key("frugal")
        await set_budget(gw.store, Scope("key", other.id), 1.0, "total")
        await gw.reload()
        status, _, body = await gw.chat(frugal, long)
        message = _error(body)["message"]
        assert status == 429 and "this request may cost up to " in message and "inf" not in message
        await gw.recorder.flush(gw.store)
        (row,) = await usage_by_day(gw.store, Scope("key", key.id))
        assert 0 < row.cost < MAX_BUDGET and math.isfinite(row.cost)

    def test_budgets_where_no_price_applies_are_reported(self) -> None:
        cfg = ServerConfig(
            models=[ModelConfig(name="priced"), ModelConfig(name="free")],
            pricing={"priced": PriceConfig(prompt_per_1k=1.0)},
        )
        budget = Budget(Scope("org", 1), 10.0, "month")
        assert budget_warnings(cfg, [budget], cfg.models) == [
            "budgets are set but no price applies to free: they never bind"
        ]
        assert budget_warnings(cfg, [], cfg.models) == []
        with_default = attrs.evolve(cfg, default_price=PriceConfig(completion_per_1k=0.5))
        assert budget_warnings(with_default, [budget], cfg.models) == []


class TestKeys:
    async def test_a_key_with_a_model_allow_list_may_call_only_those_models(self, rig: RigFactory) -> None:
        gw = await rig()
        plaintext, _ = await gw.key(models=["other-model"])
        status, _, body = await gw.chat(plaintext)
        assert (
            status == 403
            and "may not use the model 'sim-chat' (it may use: other-model)" in _error(body)["message"]
        )
        allowed, _ = await gw.key(models=[MODEL])
        assert (await gw.chat(allowed))[0] == 200

    async def test_an_expired_key_is_refused_saying_when_it_expired(self, rig: RigFactory) -> None:
        gw = await rig()
        past, _ = await gw.key("old", expires_at=datetime.now(UTC) - timedelta(minutes=1))
        future, _ = await gw.key("new", expires_at=datetime.now(UTC) + timedelta(days=1))
        status, _, body = await gw.chat(past)
        assert status == 401 and "(old) expired on" in _error(body)["message"]
        assert (await gw.chat(future))[0] == 200


class TestUsage:
    async def test_each_request_is_counted_by_key_project_model_and_status(self, rig: RigFactory) -> None:
        gw = await rig(pricing={MODEL: PriceConfig(prompt_per_1k=1000.0, completion_per_1k=0.0)})
        plaintext, key = await gw.key()
        await set_limits(gw.store, Scope("key", key.id), rpm=2, tpm=None)
        await gw.reload()
        statuses = [(await gw.chat(plaintext))[0] for _ in range(3)]
        assert statuses == [200, 200, 429]
        await gw.recorder.flush(gw.store)
        (row,) = await usage_by_day(gw.store, Scope("key", key.id))
        assert (row.requests, row.errors, row.project_id, row.model) == (3, 1, 1, MODEL)
        assert row.cost == pytest.approx(float(row.prompt_tokens)) and row.latency_ms_avg > 0


class _Clock:
    """Stands in for the time module in gateway.quotas."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_750_000_000.0 + self.now


class TestWindow:
    async def test_a_request_leaves_the_window_60_seconds_after_it_was_admitted(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from llmgw.gateway import quotas as quotas_module

        clock = _Clock()
        monkeypatch.setattr(quotas_module, "time", clock)
        _, key = await create_key(store, "k")
        await set_limits(store, Scope("key", key.id), rpm=2, tpm=None)
        quotas = Quotas(UsageRecorder())
        await quotas.refresh(store)
        quotas.admit(key, 10, 0.0)
        clock.now += 30
        quotas.admit(key, 10, 0.0)
        with pytest.raises(ApiError) as caught:
            quotas.admit(key, 10, 0.0)
        assert caught.value.headers is not None and caught.value.headers["Retry-After"] == "30"
        clock.now += 30
        quotas.admit(key, 10, 0.0)

    async def test_a_token_refusal_carries_both_header_trios_counted_exactly(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from llmgw.gateway import quotas as quotas_module

        clock = _Clock()
        monkeypatch.setattr(quotas_module, "time", clock)
        _, key = await create_key(store, "k")
        await set_limits(store, Scope("key", key.id), rpm=5, tpm=100)
        quotas = Quotas(UsageRecorder())
        await quotas.refresh(store)
        quotas.admit(key, 60, 0.0)
        clock.now += 20
        quotas.admit(key, 30, 0.0)
        clock.now += 5
        with pytest.raises(ApiError) as caught:
            quotas.admit(key, 30, 0.0)
        # The first request's 60 tokens leave the window 35 s from now; then 30 + 30 fit under 100.
        assert caught.value.headers == {
            "x-ratelimit-limit-requests": "5",
            "x-ratelimit-remaining-requests": "3",
            "x-ratelimit-reset-requests": "0s",
            "x-ratelimit-limit-tokens": "100",
            "x-ratelimit-remaining-tokens": "10",
            "x-ratelimit-reset-tokens": "35s",
            "Retry-After": "35",
            "retry-after-ms": "35000",
        }
        assert caught.value.status == 429
        assert (
            f"rate limit reached for key 'k' ({key.prefix}…): 100 tokens per minute" in caught.value.message
        )


class TestBudgetPeriods:
    @pytest.mark.parametrize(
        ("period", "starts", "renews"),
        [
            ("day", "2025-07-16", datetime(2025, 7, 17, tzinfo=UTC)),
            ("week", "2025-07-14", datetime(2025, 7, 21, tzinfo=UTC)),
            ("month", "2025-07-01", datetime(2025, 8, 1, tzinfo=UTC)),
        ],
    )
    def test_a_budget_period_starts_and_renews_on_utc_calendar_boundaries(
        self, period: str, starts: str, renews: datetime
    ) -> None:
        from llmgw.gateway import quotas as quotas_module

        # A Wednesday afternoon.
        now = datetime(2025, 7, 16, 15, 30, tzinfo=UTC).timestamp()
        assert quotas_module._period(period, now) == (starts, renews.timestamp())  # type: ignore[arg-type]

    def test_a_total_budget_never_renews(self) -> None:
        from llmgw.gateway import quotas as quotas_module

        _, ends_at = quotas_module._period("total", datetime(2025, 7, 16, tzinfo=UTC).timestamp())
        assert ends_at == float("inf")
