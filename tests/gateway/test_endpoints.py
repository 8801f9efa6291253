"""Models served by endpoints outside the fleet: routed, checked, limited, charged and failing in words."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from llmgw.catalog import Catalog, parse_model
from llmgw.config import (
    AuthConfig,
    EndpointConfig,
    ModelConfig,
    PriceConfig,
    ProfileConfig,
    ServerConfig,
    TimeoutsConfig,
)
from llmgw.engines.sim_server import make_sim_app
from llmgw.errors import ConfigError
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.deadlines import Deadlines
from llmgw.gateway.endpoints import Endpoints
from llmgw.gateway.prompts import prompt_bound
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.router import Router
from llmgw.gateway.usage import UsageRecorder
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scopes import Scope
from llmgw.store.usage import usage_by_day

from .conftest import FakeReplicas
from .fake_upstream import COMPLETION_TOKENS, ERROR_MODES, KEY, NAME, PROMPT_TOKENS, FakeUpstream, serve

CHAT = "/v1/chat/completions"
EXT = "ext-chat"
FLEET = "fleet-chat"
ENV = "LLMGW_TEST_UPSTREAM_KEY"


def _config(url: str, **ext: Any) -> ServerConfig:
    return ServerConfig(
        models=[
            ModelConfig(
                name=EXT,
                endpoints=[EndpointConfig(url=url, model=NAME, api_key_env=ENV)],
                fallbacks=[FLEET],
                pricing=PriceConfig(prompt_per_1k=1000.0, completion_per_1k=2000.0),
                timeouts=TimeoutsConfig(first_byte_s=0.3),
                **ext,
            ),
            ModelConfig(name=FLEET, profiles=[ProfileConfig(engine="sim")], fallbacks=[EXT]),
        ],
        auth=AuthConfig(enabled=True),
    )


@attrs.define
class Setup:
    client: TestClient[web.Request, web.Application]
    upstream: FakeUpstream
    endpoints: Endpoints
    fleet: FakeReplicas
    session: aiohttp.ClientSession
    store: Store
    keys: KeyCache
    quotas: Quotas
    recorder: UsageRecorder
    key: str = ""

    async def check(self) -> None:
        await self.endpoints.check(self.session)

    async def new_key(self, **kwargs: Any) -> str:
        self.key, _ = await create_key(self.store, "k", **kwargs)
        await self.keys.refresh(self.store)
        await self.quotas.refresh(self.store)
        return self.key

    async def post(self, model: str = EXT, **more: Any) -> tuple[int, dict[str, str], bytes]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **more}
        async with self.client.post(CHAT, json=body, headers={"Authorization": f"Bearer {self.key}"}) as r:
            return r.status, dict(r.headers), await r.read()


@pytest.fixture
async def setup(store: Store, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    monkeypatch.setenv(ENV, KEY)
    async with serve(FakeUpstream()) as upstream, aiohttp.ClientSession() as session:
        cfg = _config(upstream.url)
        catalog = Catalog(cfg)
        fleet = FakeReplicas()
        endpoints = Endpoints(catalog, fleet, check_s=5.0)
        keys, recorder = KeyCache(), UsageRecorder()
        quotas = Quotas(recorder)
        app = make_gateway_app(cfg, catalog, endpoints, keys, Admission(cfg, catalog, quotas, recorder))
        async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
            ready = Setup(client, upstream, endpoints, fleet, session, store, keys, quotas, recorder)
            await ready.new_key()
            await ready.check()
            yield ready


def _error(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(body)["error"]
    return error


class TestRouting:
    async def test_a_chat_goes_to_the_endpoint_with_its_key_and_the_name_it_knows_the_model_by(self, setup):
        status, headers, body = await setup.post()
        assert status == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == COMPLETION_TOKENS
        ((sent, sent_headers),) = setup.upstream.received
        assert sent["model"] == NAME
        assert sent_headers["Authorization"] == f"Bearer {KEY}"
        # The client's llmgw key never leaves the gateway.
        assert setup.key not in json.dumps(sent_headers)
        assert headers["x-llmgw-model"] == EXT
        assert headers["x-llmgw-replica"] == f"{EXT}/0"

    async def test_a_stream_goes_through_with_the_usage_the_client_did_not_ask_for_hidden(self, setup):
        status, _, body = await setup.post(stream=True)
        assert status == 200
        assert body.rstrip().endswith(b"data: [DONE]")
        assert b'"usage"' not in body
        ((sent, _),) = setup.upstream.received
        assert sent["stream_options"] == {"include_usage": True}
        ((_, totals),) = setup.recorder.pending()
        assert (totals.prompt_tokens, totals.completion_tokens) == (PROMPT_TOKENS, COMPLETION_TOKENS)

    async def test_the_endpoint_s_usage_is_charged_at_the_model_s_price(self, setup):
        await setup.post()
        await setup.recorder.flush(setup.store)
        rows = await usage_by_day(setup.store)
        assert sum(r.requests for r in rows) == 1
        assert sum(r.cost for r in rows) == pytest.approx(PROMPT_TOKENS * 1 + COMPLETION_TOKENS * 2)

    async def test_a_key_not_allowed_the_model_is_refused_before_the_endpoint_is_asked(self, setup):
        await setup.new_key(models=[FLEET])
        status, _, _ = await setup.post()
        assert status == 403
        assert setup.upstream.received == []

    async def test_a_request_past_the_rpm_limit_is_refused_exactly_there(self, setup):
        await set_limits(setup.store, Scope("project", 1), rpm=2, tpm=None)
        await setup.quotas.refresh(setup.store)
        assert [(await setup.post())[0] for _ in range(3)] == [200, 200, 429]
        assert len(setup.upstream.received) == 2

    async def test_a_budget_spent_on_the_endpoint_refuses_the_next_request_exactly(self, setup):
        # A request reserves its prompt's bound (prompts.py) at 1 a token and 8 completion tokens at
        # 2, and costs what the endpoint reported: 7 * 1 + 3 * 2 = 13. A budget one short of 13 plus a
        # reservation admits one request, then refuses the next.
        body = {"model": EXT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        reserved = prompt_bound(body) + 8 * 2
        await set_budget(setup.store, Scope("project", 1), 13.0 + reserved - 1, "total")
        await setup.quotas.refresh(setup.store)
        assert [(await setup.post())[0] for _ in range(2)] == [200, 429]
        assert setup.recorder.pending()[0][1].cost == pytest.approx(13.0)


class TestFallbacks:
    async def test_a_fleet_model_without_a_ready_replica_falls_back_to_the_endpoint_model(self, setup):
        status, headers, _ = await setup.post(FLEET)
        assert status == 200
        assert headers["x-llmgw-model"] == EXT
        ((sent, _),) = setup.upstream.received
        assert sent["model"] == NAME

    async def test_an_endpoint_model_whose_endpoint_fails_falls_back_to_the_fleet(self, setup):
        sim = TestServer(make_sim_app(FLEET), host="127.0.0.1", port=0)
        await sim.start_server()
        try:
            setup.fleet.endpoints[FLEET] = [f"http://127.0.0.1:{sim.port}"]
            setup.upstream.key = "rotated"
            await setup.check()
            status, headers, body = await setup.post()
        finally:
            await sim.close()
        assert status == 200
        assert headers["x-llmgw-model"] == FLEET
        assert json.loads(body)["model"] == FLEET

    async def test_a_busy_fleet_model_falls_back_to_an_endpoint_past_its_load_bound(self, store, monkeypatch):
        monkeypatch.setenv(ENV, KEY)
        async with serve(FakeUpstream()) as upstream, aiohttp.ClientSession() as session:
            cfg = _config(upstream.url)
            busy = attrs.evolve(cfg.models[1], fallback_when_busy=1)
            catalog = Catalog(attrs.evolve(cfg, models=[cfg.models[0], busy]))
            endpoints = Endpoints(catalog, FakeReplicas(endpoints={FLEET: ["http://127.0.0.1:9"]}), 5.0)
            await endpoints.check(session)
            router = Router(catalog, endpoints)
            assert router.route(FLEET) == (FLEET, "http://127.0.0.1:9")
            # Its one replica has a request in flight: the next goes to the endpoint model.
            assert router.route(FLEET) == (EXT, f"{EXT}/0")
            router.release("http://127.0.0.1:9")
            assert router.route(FLEET) == (FLEET, "http://127.0.0.1:9")


class TestUpstreamErrors:
    async def test_a_wrong_key_is_a_502_naming_the_endpoint_and_it_leaves_the_table(self, setup):
        setup.upstream.mode = "401"
        status, _, body = await setup.post()
        error = _error(body)
        assert status == 502
        assert error["code"] == "upstream_key_refused"
        assert f"{EXT}/0" in error["message"] and "key for it is wrong" in error["message"]
        assert KEY not in body.decode() and KEY[:6] not in body.decode()
        assert setup.endpoints.ready_endpoints(EXT) == ()
        (status_of,) = setup.endpoints.statuses(EXT)
        assert status_of.state == "failing" and "its key is wrong" in status_of.detail

    async def test_an_unknown_model_is_a_502_saying_so(self, setup):
        setup.upstream.mode = "404"
        status, _, body = await setup.post()
        assert status == 502
        error = _error(body)
        assert error["code"] == "upstream_model_not_found"
        assert f"does not know the model '{NAME}'" in error["message"]

    async def test_a_429_is_passed_on_with_its_retry_after(self, setup):
        setup.upstream.mode = "429"
        status, headers, body = await setup.post()
        assert status == 429
        assert headers["Retry-After"] == "17"
        error = _error(body)
        assert error["code"] == "upstream_rate_limited"
        assert f"{EXT}/0" in error["message"]

    async def test_a_5xx_is_a_502_naming_the_endpoint_without_the_key_it_quoted(self, setup):
        setup.upstream.mode = "500"
        with capture_logs() as logs:
            status, _, body = await setup.post()
        assert status == 500
        assert f"{EXT}/0" in _error(body)["message"]
        assert KEY not in body.decode()
        assert KEY not in repr(logs)

    async def test_a_client_s_own_400_is_passed_on_without_the_key_it_quoted(self, setup):
        setup.upstream.mode = "400"
        status, _, body = await setup.post()
        assert status == 400
        assert "max_tokens is too large" in _error(body)["message"]
        assert KEY not in body.decode()

    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
    @pytest.mark.parametrize("mode", ERROR_MODES)
    async def test_no_reply_to_an_endpoint_s_error_holds_the_key_it_quoted(self, setup, mode, stream):
        """The fake quoted its key only in 400 and 500 replies: left in a 404's or 429's words, it passed."""
        setup.upstream.mode = mode
        with capture_logs() as logs:
            status, headers, body = await setup.post(stream=stream)
        assert status >= 400
        assert setup.upstream.received, "the endpoint was never asked"
        shown = [body.decode(), repr(headers), repr(logs), repr(setup.endpoints.statuses())]
        assert not [said for said in shown if KEY in said]

    async def test_an_endpoint_that_sends_nothing_is_a_504_naming_the_model_s_timeout(self, setup):
        setup.upstream.mode = "hang"
        status, _, body = await setup.post()
        assert status == 504
        error = _error(body)
        assert "timeouts.first_byte_s" in error["message"] and f"{EXT}/0" in error["message"]

    async def test_a_refused_connection_is_a_502_naming_the_endpoint(self, setup):
        # A port nobody listens on: the check finds it first, and so does a request routed before it.
        closed = TestServer(web.Application(), host="127.0.0.1", port=0)
        await closed.start_server()
        port = closed.port
        await closed.close()
        cfg = _config(f"http://127.0.0.1:{port}/v1")
        catalog = Catalog(cfg)
        endpoints = Endpoints(catalog, FakeReplicas(), 5.0)
        await endpoints.check(setup.session)
        (state,) = endpoints.statuses(EXT)
        assert state.state == "failing" and "did not take the connection" in state.detail
        app = make_gateway_app(
            attrs.evolve(cfg, auth=AuthConfig(enabled=False)), catalog, endpoints, KeyCache()
        )
        async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
            endpoints.statuses(EXT)
            reply = await client.post(CHAT, json={"model": EXT, "messages": []})
            body = await reply.read()
        assert reply.status == 503
        assert f"{EXT} has no ready endpoint: {EXT}/0: {state.detail}" in _error(body)["message"]


def _content(body: bytes, stream: bool) -> str:
    """The reply's text: the message's content, or a stream's deltas joined."""
    if not stream:
        content: str = json.loads(body)["choices"][0]["message"]["content"]
        return content
    assert body.rstrip().endswith(b"data: [DONE]")
    events = [line.removeprefix(b"data: ") for line in body.split(b"\n\n") if line.startswith(b"data: {")]
    return " ".join(json.loads(e)["choices"][0]["delta"]["content"] for e in events)


class TestAKeyQuotedInAReply:
    """An endpoint that quotes its key in a 200 (an echo of the request, a debug field): its errors were
    struck of the key, its replies were not."""

    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
    async def test_a_reply_that_quotes_the_key_reaches_the_client_without_it(self, setup, stream):
        setup.upstream.mode = "quote"
        status, headers, body = await setup.post(stream=stream)
        assert status == 200
        assert KEY not in body.decode() and KEY not in repr(headers)
        assert _content(body, stream) == "one two three (sent with the key [its key])"

    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
    async def test_a_key_cut_between_two_reads_of_the_reply_is_struck_out_too(
        self, setup, stream, monkeypatch: pytest.MonkeyPatch
    ):
        reads: list[bytes] = []
        read = Deadlines.read

        async def reading(self: Deadlines, *args: Any) -> bytes:
            data = await read(self, *args)
            reads.append(data)
            # The first half is in: the endpoint sends the rest.
            setup.upstream.release.set()
            return data

        monkeypatch.setattr(Deadlines, "read", reading)
        setup.upstream.mode = "quote-split"
        status, _, body = await setup.post(stream=stream)
        assert status == 200
        half = KEY[: len(KEY) // 2].encode()
        assert [r for r in reads if half in r and KEY.encode() not in r], (
            "the key was never cut between reads"
        )
        assert KEY not in body.decode()
        assert _content(body, stream) == "one two three (sent with the key [its key])"


class TestChecks:
    async def test_a_ready_endpoint_says_so(self, setup):
        (state,) = setup.endpoints.statuses()
        assert (state.state, state.id, state.url) == ("ready", f"{EXT}/0", setup.upstream.url)

    async def test_a_wrong_key_is_said_in_words(self, setup):
        setup.upstream.key = "another"
        await setup.check()
        (state,) = setup.endpoints.statuses()
        assert state.detail == f"{setup.upstream.url} answered 401: its key is wrong (api_key_env {ENV})"

    async def test_a_model_the_endpoint_does_not_list_is_said_with_those_it_does(self, setup):
        setup.upstream.models = ["a", "b"]
        await setup.check()
        (state,) = setup.endpoints.statuses()
        assert state.detail == f"{setup.upstream.url} does not serve a model '{NAME}' (it lists a, b)"

    async def test_a_key_missing_from_the_environment_is_said_and_nothing_is_sent(self, setup, monkeypatch):
        monkeypatch.delenv(ENV)
        await setup.check()
        (state,) = setup.endpoints.statuses()
        assert state.state == "failing"
        assert ENV in state.detail and "not set" in state.detail

    async def test_a_key_file_is_read_at_each_check(self, setup, tmp_path):
        path = tmp_path / "key"
        path.write_text(KEY + "\n")
        cfg = ServerConfig(
            models=[
                ModelConfig(
                    name=EXT, endpoints=[EndpointConfig(url=setup.upstream.url, api_key_file=str(path))]
                )
            ]
        )
        setup.upstream.models = [EXT]
        endpoints = Endpoints(Catalog(cfg), FakeReplicas(), 5.0)
        await endpoints.check(setup.session)
        assert endpoints.ready_endpoints(EXT) == (f"{EXT}/0",)
        path.write_text("old")
        await endpoints.check(setup.session)
        assert endpoints.ready_endpoints(EXT) == ()


class TestDefinitions:
    def test_a_model_with_both_profiles_and_endpoints_is_refused_in_words(self):
        text = "name: both\nprofiles:\n  - engine: sim\nendpoints:\n  - url: http://10.1.2.3:8000/v1\n"
        with pytest.raises(ConfigError, match=r"both.yaml:4: both has both 'profiles' .* one or the other"):
            parse_model(text, "both.yaml")

    def test_a_model_with_endpoints_needs_no_profile(self):
        model = parse_model(
            "name: ext\nendpoints:\n  - url: http://10.1.2.3:8000/v1\n    model: up\n    api_key_env: K\n",
            "ext.yaml",
        )
        assert model.endpoints == [EndpointConfig(url="http://10.1.2.3:8000/v1", model="up", api_key_env="K")]

    def test_a_key_in_the_url_is_refused(self):
        text = "name: ext\nendpoints:\n  - url: http://user:sk-1@10.1.2.3:8000/v1\n"
        with pytest.raises(ConfigError, match="put its key in 'api_key_env' or 'api_key_file'"):
            parse_model(text, "ext.yaml")

    def test_an_endpoint_naming_two_keys_is_refused(self):
        text = "name: ext\nendpoints:\n  - url: http://h/v1\n    api_key_env: K\n    api_key_file: /k\n"
        with pytest.raises(ConfigError, match="names both 'api_key_env' and 'api_key_file'"):
            parse_model(text, "ext.yaml")
