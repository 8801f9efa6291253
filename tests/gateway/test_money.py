"""Money that adds up: true usage for every stream, reservations that are upper bounds, refusals that help."""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.engines.sim_server import make_sim_app
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.pipeline import Call
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder, find_usage
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scopes import Scope
from llmgw.store.usage import usage_by_day

from ..waiting import eventually
from .conftest import MODEL, FakeReplicas

CHAT = "/v1/chat/completions"
# What differs between two calls to the same engine: the completion's id and its creation time.
_PER_CALL = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def normalised(stream: bytes) -> bytes:
    return _PER_CALL.sub(rb'"\1":"-"', stream)


@attrs.define
class Money:
    """A gateway with admission in front of one engine, and the engine's own URL."""

    client: TestClient[web.Request, web.Application]
    engine: str
    store: Store
    keys: KeyCache
    quotas: Quotas
    recorder: UsageRecorder

    async def key(self, name: str = "k", **kwargs: Any) -> str:
        plaintext, _ = await create_key(self.store, name, **kwargs)
        await self.keys.refresh(self.store)
        await self.quotas.refresh(self.store)
        return plaintext

    async def post(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        async with self.client.post(CHAT, data=_json(body), headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, dict(r.headers), await r.read()

    async def direct(self, body: dict[str, Any]) -> bytes:
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.engine + CHAT, data=_json(body)) as r,
        ):
            assert r.status == 200
            return await r.read()

    async def usage(self) -> tuple[int, int, int, float]:
        """(requests, prompt tokens, completion tokens, cost) of everything recorded, once in the store."""
        await self.recorder.flush(self.store)
        rows = await usage_by_day(self.store)
        return (
            sum(r.requests for r in rows),
            sum(r.prompt_tokens for r in rows),
            sum(r.completion_tokens for r in rows),
            sum(r.cost for r in rows),
        )


MoneyFactory = Callable[..., Awaitable[Money]]


def _json(body: dict[str, Any]) -> bytes:
    # UTF-8 as it is, not \u escapes: the request's bytes are what its prompt is bounded by.
    return json.dumps(body, ensure_ascii=False).encode()


@pytest.fixture
async def money(store: Store) -> AsyncIterator[MoneyFactory]:
    servers: list[TestServer] = []
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(*, engine: str = "", ttft_ms: float = 0, tokens_per_s: float = 0, **cfg: Any) -> Money:
        if not engine:
            sim = TestServer(make_sim_app(MODEL, ttft_ms, tokens_per_s), host="127.0.0.1", port=0)
            await sim.start_server()
            servers.append(sim)
            engine = f"http://127.0.0.1:{sim.port}"
        model = ModelConfig(name=MODEL, max_tokens=cfg.pop("max_tokens", 4096))
        config = ServerConfig(models=[model], **cfg)
        keys = KeyCache()
        recorder = UsageRecorder()
        quotas = Quotas(recorder)
        catalog = Catalog(config)
        admission = Admission(config, catalog, quotas, recorder)
        app = make_gateway_app(config, catalog, FakeReplicas(endpoints={MODEL: [engine]}), keys, admission)
        client = TestClient(TestServer(app, host="127.0.0.1", port=0))
        await client.start_server()
        clients.append(client)
        return Money(client, engine, store, keys, quotas, recorder)

    yield make
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()


def _chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}


# Text that tokenizes densely: one-letter words, CJK, emoji, punctuation (each a token to the sim).
ADVERSARIAL = "a " * 300 + "汉字" * 200 + "🙂👍🏽" * 100 + "!?" * 100


class TestStreamUsage:
    @pytest.mark.parametrize("paced", [False, True], ids=["whole", "paced"])
    async def test_a_stream_that_did_not_ask_for_usage_is_charged_the_engines_count_and_sees_no_usage(
        self, money: MoneyFactory, paced: bool
    ) -> None:
        # Paced, the sim streams token by token; unpaced, its reply arrives in one read.
        gw = await money(ttft_ms=5 if paced else 0, tokens_per_s=500 if paced else 0)
        key = await gw.key()
        body = _chat("one two three four five six seven", stream=True, max_tokens=50)
        status, _, through = await gw.post(key, body)
        assert status == 200
        direct = await gw.direct(body)
        # Byte for byte what the engine sends a call without usage, ids and timestamps aside.
        assert normalised(through) == normalised(direct)
        assert b'"usage"' not in through
        asked = await gw.direct({**body, "stream_options": {"include_usage": True}})
        engine_count = find_usage(asked)
        assert engine_count == (7, 7)
        assert await gw.usage() == (1, 7, 7, 0.0)

    async def test_a_stream_that_asked_for_usage_keeps_its_usage_chunk(self, money: MoneyFactory) -> None:
        gw = await money(ttft_ms=5, tokens_per_s=500)
        key = await gw.key()
        body = _chat("one two three", stream=True, max_tokens=50, stream_options={"include_usage": True})
        _, _, through = await gw.post(key, body)
        assert normalised(through) == normalised(await gw.direct(body))
        assert find_usage(through) == (3, 3)
        assert (await gw.usage())[1:3] == (3, 3)

    async def test_a_client_that_leaves_early_is_charged_what_it_was_sent_when_the_engine_reported_nothing(
        self, money: MoneyFactory
    ) -> None:
        gw = await money(ttft_ms=1, tokens_per_s=20, max_tokens=64)
        key = await gw.key()
        body = _chat(" ".join(["w"] * 40), stream=True)
        async with gw.client.post(CHAT, data=_json(body), headers={"Authorization": f"Bearer {key}"}) as r:
            await r.content.readuntil(b"\n\n")
            r.close()
        await eventually(lambda: gw.recorder.pending())
        # The sim reports usage only at the end: the prompt bound, and a completion token for each event
        # the gateway passed on (the one read, and any on their way), not the 64 of max_tokens.
        requests, prompt, completion, _ = await gw.usage()
        assert requests == 1
        assert 1 <= completion < 64
        assert prompt >= len(_json(body))


class TestReservations:
    async def test_a_request_without_max_tokens_is_sent_with_the_models_limit(
        self, money: MoneyFactory
    ) -> None:
        gw = await money(max_tokens=4)
        key = await gw.key()
        status, _, body = await gw.post(key, _chat("one two three four five six"))
        assert status == 200
        reply = json.loads(body)
        assert reply["choices"][0]["message"]["content"] == "one two three four"
        assert reply["usage"]["completion_tokens"] == 4

    async def test_a_request_asking_more_than_the_models_limit_is_refused_with_400(
        self, money: MoneyFactory
    ) -> None:
        gw = await money(max_tokens=100)
        key = await gw.key()
        for fields in ({"max_tokens": 101}, {"max_completion_tokens": 60, "n": 2}):
            status, _, body = await gw.post(key, _chat("hi", **fields))
            error = json.loads(body)["error"]
            assert status == 400 and error["code"] == "max_tokens_too_large"
            assert "sim-chat allows at most 100" in error["message"]
        # Counted, as every refusal is: two requests, both errors, nothing used.
        assert await gw.usage() == (2, 0, 0, 0.0)

    # Every time: the same burst on fresh gateways, three times over.
    @pytest.mark.parametrize("round_", range(3))
    async def test_200_concurrent_adversarial_prompts_never_take_a_budget_or_a_tpm_window_past_its_limit(
        self, money: MoneyFactory, store: Store, round_: int
    ) -> None:
        # Prompts that tokenize to more than a byte count over four: one-letter words, CJK, emoji.
        prompts = ["a " * 3000, "汉字" * 1000, "☀" * 2000, "🙂👍🏽" * 500, "x" * 100]
        price = PriceConfig(prompt_per_1k=1.0, completion_per_1k=2.0)
        gw = await money(pricing={MODEL: price}, max_tokens=64)
        key = await gw.key()
        budget, tpm = 40.0, 30_000
        await set_budget(store, Scope("project", 1), budget, "total")
        await set_limits(store, Scope("project", 1), rpm=None, tpm=tpm)
        await gw.quotas.refresh(store)
        bodies = [
            _chat(prompts[i % len(prompts)], **({"max_tokens": 1 + i % 64} if i % 3 else {}))
            for i in range(200)
        ]
        results = await asyncio.gather(*(gw.post(key, body) for body in bodies))
        used = [json.loads(raw)["usage"] for status, _, raw in results if status == 200]
        assert used and len(used) < 200
        _, prompt, completion, spent = await gw.usage()
        assert sum(u["prompt_tokens"] + u["completion_tokens"] for u in used) == prompt + completion
        assert prompt + completion <= tpm
        assert spent <= budget
        # What the engine counted is what was charged, and it is more than a byte count over four.
        admitted = [b for (status, _, _), b in zip(results, bodies, strict=True) if status == 200]
        assert prompt > sum(len(_json(b)) // 4 for b in admitted)

    async def test_a_prompt_of_400_one_letter_words_is_admitted_under_the_budget_it_fits(
        self, money: MoneyFactory, store: Store
    ) -> None:
        # 401 tokens at 1 a thousand: 0.401 of a budget of 1.0. A token per byte of the body reserved
        # 1,013 tokens, and it was refused however much of the budget was left.
        price = PriceConfig(prompt_per_1k=1.0, completion_per_1k=1.0)
        gw = await money(pricing={MODEL: price})
        key = await gw.key()
        await set_budget(store, Scope("project", 1), 1.0, "total")
        await gw.quotas.refresh(store)
        status, _, body = await gw.post(key, _chat(" ".join(["a"] * 400), max_tokens=1))
        assert status == 200, body
        requests, prompt, completion, spent = await gw.usage()
        assert (requests, prompt, completion) == (1, 400, 1)
        assert spent == pytest.approx(0.401)

    async def test_cjk_sent_as_unicode_escapes_reserves_its_decoded_bytes(
        self, money: MoneyFactory, store: Store
    ) -> None:
        # 400 characters: 1,200 bytes of UTF-8, 2,400 of \u escapes in the body. A tpm of 1,500 holds
        # the first, and refused the request while it was reserved by the second.
        gw = await money()
        key = await gw.key()
        await set_limits(store, Scope("project", 1), rpm=None, tpm=1500)
        await gw.quotas.refresh(store)
        body = json.dumps(_chat("汉" * 400, max_tokens=1)).encode()
        assert b"\\u6c49" in body and len(body) > 2400
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        async with gw.client.post(CHAT, data=body, headers=headers) as r:
            assert r.status == 200, await r.text()
        assert (await gw.usage())[1:3] == (400, 1)

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            (CHAT, _chat(ADVERSARIAL, max_tokens=4)),
            ("/v1/completions", {"model": MODEL, "prompt": [ADVERSARIAL, ADVERSARIAL], "max_tokens": 4}),
            (
                "/v1/messages",
                {
                    "model": MODEL,
                    "system": ADVERSARIAL,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": ADVERSARIAL}]}],
                },
            ),
            (
                "/v1/responses",
                {"model": MODEL, "instructions": ADVERSARIAL, "input": ADVERSARIAL, "max_output_tokens": 4},
            ),
        ],
        ids=["chat", "completions", "messages", "responses"],
    )
    async def test_dense_prompts_of_every_api_are_charged_the_engines_count_never_held_to_the_bound(
        self, money: MoneyFactory, path: str, body: dict[str, Any]
    ) -> None:
        gw = await money()
        key = await gw.key()
        with capture_logs() as logs:
            async with gw.client.post(
                path, data=_json(body), headers={"Authorization": f"Bearer {key}"}
            ) as r:
                assert r.status == 200, await r.text()
                reply = await r.json()
        assert not [e for e in logs if e["event"].startswith("engine reported usage that cannot be true")]
        usage = reply["usage"]
        counted = usage.get("prompt_tokens", usage.get("input_tokens"))
        assert counted > len(_json(body)) // 4
        assert (await gw.usage())[1] == counted


class TestRefusals:
    async def test_a_total_budget_refusal_says_no_retry_will_help_and_sends_no_retry_after(
        self, money: MoneyFactory, store: Store
    ) -> None:
        gw = await money(pricing={MODEL: PriceConfig(prompt_per_1k=1000.0, completion_per_1k=1000.0)})
        key = await gw.key()
        await set_budget(store, Scope("org", 1), 100.0, "total")
        await gw.quotas.refresh(store)
        status, headers, body = await gw.post(key, _chat("hi", max_tokens=8))
        error = json.loads(body)["error"]
        assert status == 429 and error["code"] == "insufficient_quota"
        assert "Retry-After" not in headers
        assert error["message"].startswith("the budget of org 'default' has too little left for this request")
        assert "a total budget does not renew, so no retry will help" in error["message"]

    async def test_a_period_budget_refusal_says_when_it_renews(
        self, money: MoneyFactory, store: Store
    ) -> None:
        gw = await money(pricing={MODEL: PriceConfig(prompt_per_1k=1000.0, completion_per_1k=1000.0)})
        key = await gw.key()
        await set_budget(store, Scope("team", 1), 100.0, "week")
        await gw.quotas.refresh(store)
        status, headers, body = await gw.post(key, _chat("hi", max_tokens=8))
        error = json.loads(body)["error"]
        assert status == 429 and error["code"] == "insufficient_quota"
        assert "the budget of team 'default' (org 'default')" in error["message"]
        assert re.search(r"it renews on \d{4}-\d\d-\d\d \(UTC\)$", error["message"])
        assert 1 <= int(headers["Retry-After"]) <= 7 * 86400

    async def test_a_request_larger_than_a_whole_tpm_is_refused_saying_no_retry_will_help(
        self, money: MoneyFactory, store: Store
    ) -> None:
        gw = await money()
        key = await gw.key()
        await set_limits(store, Scope("project", 1), rpm=None, tpm=500)
        await gw.quotas.refresh(store)
        status, headers, body = await gw.post(key, _chat("hi", max_tokens=1000))
        error = json.loads(body)["error"]
        assert status == 429 and error["code"] == "rate_limit_exceeded"
        assert "Retry-After" not in headers and headers["x-ratelimit-limit-tokens"] == "500"
        assert "project 'default'" in error["message"] and "no retry will help" in error["message"]


class TestFallbackStreams:
    async def test_a_stream_served_by_a_fallback_is_still_charged_the_engines_count_and_sees_no_usage(
        self, store: Store
    ) -> None:
        sim = TestServer(make_sim_app("small"), host="127.0.0.1", port=0)
        await sim.start_server()
        config = ServerConfig(
            models=[ModelConfig(name="big", fallbacks=["small"]), ModelConfig(name="small")]
        )

        keys, recorder = KeyCache(), UsageRecorder()
        quotas = Quotas(recorder)
        catalog = Catalog(config)
        app = make_gateway_app(
            config,
            catalog,
            FakeReplicas(endpoints={"small": [f"http://127.0.0.1:{sim.port}"]}),
            keys,
            Admission(config, catalog, quotas, recorder),
        )
        async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
            plaintext, _ = await create_key(store, "k")
            await keys.refresh(store)
            await quotas.refresh(store)
            body = {
                "model": "big",
                "messages": [{"role": "user", "content": "one two three"}],
                "stream": True,
            }
            async with client.post(
                CHAT, data=_json(body), headers={"Authorization": f"Bearer {plaintext}"}
            ) as r:
                assert r.status == 200
                assert r.headers["x-llmgw-model"] == "small"
                through = await r.read()
        await sim.close()
        # The usage the admission asked of the engine for the fallback too, and hid from the client.
        assert b'"usage"' not in through
        await recorder.flush(store)
        rows = await usage_by_day(store)
        assert (sum(r.prompt_tokens for r in rows), sum(r.completion_tokens for r in rows)) == (3, 3)


class TestWhatAccountingCosts:
    async def test_a_request_through_admission_leaves_nothing_for_the_garbage_collector(
        self, money: MoneyFactory
    ) -> None:
        # A call kept alive by a reference cycle waits, with its request, body and reply, for the cycle
        # collector: on every request, a cost the gateway's throughput pays.
        gw = await money()
        key = await gw.key()
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for body in (_chat("one two three"), _chat("one two three", stream=True)):
                status, _, _ = await gw.post(key, body)
                assert status == 200
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, Call)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == []


@pytest.fixture
async def lying_engine() -> AsyncIterator[Callable[[dict[str, Any]], Awaitable[str]]]:
    """An engine that answers every chat with the usage it is told to claim."""
    runners: list[web.AppRunner] = []

    async def start(usage: dict[str, Any]) -> str:
        async def chat(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                    "usage": usage,
                }
            )

        app = web.Application()
        app.router.add_post(CHAT, chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


LyingEngine = Callable[[dict[str, Any]], Awaitable[str]]


class TestUsageAnEngineCannotHaveUsed:
    async def test_a_reply_claiming_a_trillion_prompt_tokens_is_charged_no_more_than_the_request_reserved(
        self, money: MoneyFactory, store: Store, lying_engine: LyingEngine
    ) -> None:
        engine = await lying_engine({"prompt_tokens": 10**12, "completion_tokens": 1, "total_tokens": 10**12})
        gw = await money(
            engine=engine, pricing={MODEL: PriceConfig(prompt_per_1k=0.001, completion_per_1k=0.001)}
        )
        key = await gw.key()
        await set_budget(store, Scope("project", 1), 10.0, "total")
        await gw.quotas.refresh(store)
        body = _chat("hello", max_tokens=8)
        statuses = [(await gw.post(key, body))[0] for _ in range(3)]
        assert statuses == [200, 200, 200], (
            "one lying reply must not spend the budget for every later request"
        )
        _, prompt, completion, spent = await gw.usage()
        reserved_prompt = len(_json(body)) + 128
        assert prompt <= 3 * reserved_prompt
        assert completion == 3
        assert spent < 10.0

    async def test_replies_claiming_negative_tokens_never_give_money_back(
        self, money: MoneyFactory, store: Store, lying_engine: LyingEngine
    ) -> None:
        engine = await lying_engine(
            {"prompt_tokens": 5, "completion_tokens": -1_000_000, "total_tokens": -999_995}
        )
        gw = await money(
            engine=engine, pricing={MODEL: PriceConfig(prompt_per_1k=1.0, completion_per_1k=1.0)}
        )
        key = await gw.key()
        with capture_logs() as logs:
            for _ in range(2):
                assert (await gw.post(key, _chat("hello", max_tokens=8)))[0] == 200
        said = [e for e in logs if e["event"].startswith("engine reported usage that cannot be true")]
        assert len(said) == 2 and said[0]["reported_completion_tokens"] == -1_000_000
        _, prompt, completion, spent = await gw.usage()
        assert (prompt, completion) == (10, 0)
        assert spent >= 0

    async def test_a_reply_claiming_more_completion_than_max_tokens_is_charged_max_tokens(
        self, money: MoneyFactory, lying_engine: LyingEngine
    ) -> None:
        engine = await lying_engine({"prompt_tokens": 5, "completion_tokens": 500, "total_tokens": 505})
        gw = await money(engine=engine)
        key = await gw.key()
        assert (await gw.post(key, _chat("hello", max_tokens=8, n=2)))[0] == 200
        _, _, completion, _ = await gw.usage()
        assert completion == 16
