"""The gateway's Prometheus series and request ids: what a scraper and a log reader see of a request."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from structlog.testing import capture_logs

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, PriceConfig, ServerConfig
from llmgw.gateway.admission import Admission
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.metrics import GatewayMetrics, budget_families
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.routes import EngineRoute
from llmgw.store import Store
from llmgw.store.keys import create_key
from llmgw.store.quotas import set_budget, set_limits
from llmgw.store.scopes import Scope

from ..waiting import eventually
from .conftest import MODEL, FakeEngine, FakeReplicas

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8}


@attrs.define
class Rig:
    client: TestClient[web.Request, web.Application]
    registry: CollectorRegistry
    replicas: FakeReplicas
    quotas: Quotas
    key: str
    project: str

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 when the series does not exist."""
        return self.registry.get_sample_value(name, labels) or 0.0

    async def chat(
        self, body: dict[str, Any] | None = None, key: str | None = None, **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        sent = {"Authorization": f"Bearer {self.key if key is None else key}", **headers}
        async with self.client.post(CHAT, json=body or BODY, headers=sent) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}, await reply.read()


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def rig(store: Store, sim: str) -> AsyncIterator[RigFactory]:
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(*, endpoint: str = "", log_requests: bool = False, **cfg_changes: Any) -> Rig:
        cfg = ServerConfig(
            models=[ModelConfig(name=MODEL)],
            default_price=PriceConfig(prompt_per_1k=1.0, completion_per_1k=2.0),
            **cfg_changes,
        )
        plaintext, record = await create_key(store, "metrics")
        keys = KeyCache()
        await keys.refresh(store)
        recorder = UsageRecorder()
        quotas = Quotas(recorder)
        await quotas.refresh(store)
        catalog = Catalog(cfg)
        registry = CollectorRegistry()
        replicas = FakeReplicas(endpoints={MODEL: [endpoint or sim]})
        app = make_gateway_app(
            cfg,
            catalog,
            replicas,
            keys,
            Admission(cfg, catalog, quotas, recorder),
            GatewayMetrics(registry, catalog, log_requests=log_requests),
        )
        client = TestClient(TestServer(app, host="127.0.0.1", port=0))
        await client.start_server()
        clients.append(client)
        return Rig(client, registry, replicas, quotas, plaintext, str(record.project_id))

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    from llmgw.engines.sim_server import make_sim_app

    server = TestServer(make_sim_app(MODEL), host="127.0.0.1", port=0)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TestRequestsCounted:
    async def test_each_request_is_counted_once_by_model_served_model_project_status_and_code(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        for _ in range(3):
            assert (await gw.chat())[0] == 200
        assert (await gw.chat(key="llmgw-not-a-key"))[0] == 401
        ok = {
            "model": MODEL,
            "served_model": MODEL,
            "project": gw.project,
            "status": "2xx",
            "code": "",
            "route": "chat",
        }
        assert gw.value("llmgw_requests_total", **ok) == 3
        refused = {
            "model": "",
            "served_model": "",
            "project": "",
            "status": "4xx",
            "code": "invalid_api_key",
            "route": "chat",
        }
        assert gw.value("llmgw_requests_total", **refused) == 1

    async def test_concurrent_requests_are_counted_exactly_and_leave_nothing_in_flight(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        statuses = await asyncio.gather(*(gw.chat({**BODY, "stream": i % 2 == 0}) for i in range(100)))
        assert [s for s, _, _ in statuses] == [200] * 100
        ok = {
            "model": MODEL,
            "served_model": MODEL,
            "project": gw.project,
            "status": "2xx",
            "code": "",
            "route": "chat",
        }
        assert gw.value("llmgw_requests_total", **ok) == 100
        assert gw.value("llmgw_request_duration_seconds_count", model=MODEL) == 100
        assert gw.value("llmgw_requests_in_flight", model=MODEL) == 0

    async def test_a_model_name_the_catalog_does_not_serve_never_becomes_a_label_value(
        self, rig: RigFactory
    ) -> None:
        gw = await rig()
        for i in range(5):
            status, _, _ = await gw.chat({**BODY, "model": f"client-chosen-{i}"})
            assert status == 404
        page = (await gw.client.get("/health")).status
        assert page == 200
        values = {
            sample.labels["model"]
            for family in gw.registry.collect()
            for sample in family.samples
            if "model" in sample.labels
        }
        assert not any(v.startswith("client-chosen") for v in values)
        unknown = {"model": "", "served_model": "", "project": gw.project, "status": "4xx", "route": "chat"}
        assert gw.value("llmgw_requests_total", **unknown, code="model_not_found") == 5

    async def test_tokens_and_cost_are_counted_from_the_engines_own_usage(self, rig: RigFactory) -> None:
        gw = await rig()
        status, _, body = await gw.chat()
        assert status == 200
        usage = json.loads(body)["usage"]
        labels = {"model": MODEL, "project": gw.project}
        assert gw.value("llmgw_prompt_tokens_total", **labels) == usage["prompt_tokens"]
        assert gw.value("llmgw_completion_tokens_total", **labels) == usage["completion_tokens"]
        expected = (usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0) / 1000
        assert gw.value("llmgw_cost_total", project=gw.project) == pytest.approx(expected)

    async def test_duration_and_time_to_first_byte_are_observed_per_model(self, rig: RigFactory) -> None:
        gw = await rig()
        for _ in range(2):
            assert (await gw.chat({**BODY, "stream": True}))[0] == 200
        assert gw.value("llmgw_request_duration_seconds_count", model=MODEL) == 2
        assert gw.value("llmgw_time_to_first_byte_seconds_count", model=MODEL) == 2
        # The buckets reach ten minutes: a long generation is not lumped into +Inf.
        assert gw.value("llmgw_request_duration_seconds_bucket", model=MODEL, le="600.0") == 2

    async def test_a_request_is_in_flight_until_its_stream_ends(self, rig: RigFactory) -> None:
        fake = FakeEngine()
        app = web.Application()
        app.router.add_post(CHAT, fake.chat)
        engine = TestServer(app, host="127.0.0.1", port=0)
        await engine.start_server()
        try:
            gw = await rig(endpoint=f"http://127.0.0.1:{engine.port}")
            task = asyncio.create_task(gw.chat({**BODY, "stream": True}))
            await fake.first_chunk_sent.wait()
            await eventually(lambda: gw.value("llmgw_requests_in_flight", model=MODEL) == 1)
            fake.release.set()
            assert (await task)[0] == 200
            assert gw.value("llmgw_requests_in_flight", model=MODEL) == 0
        finally:
            fake.release.set()
            await engine.close()

    async def test_a_client_that_leaves_mid_stream_is_no_longer_in_flight(self, rig: RigFactory) -> None:
        fake = FakeEngine()
        app = web.Application()
        app.router.add_post(CHAT, fake.chat)
        engine = TestServer(app, host="127.0.0.1", port=0)
        await engine.start_server()
        try:
            gw = await rig(endpoint=f"http://127.0.0.1:{engine.port}")
            reply = await gw.client.post(
                CHAT, json={**BODY, "stream": True}, headers={"Authorization": f"Bearer {gw.key}"}
            )
            await reply.content.readany()
            assert gw.value("llmgw_requests_in_flight", model=MODEL) == 1
            reply.close()
            fake.release.set()
            await eventually(lambda: gw.value("llmgw_requests_in_flight", model=MODEL) == 0)
            await eventually(lambda: gw.value("llmgw_request_duration_seconds_count", model=MODEL) == 1)
        finally:
            fake.release.set()
            await engine.close()

    async def test_an_engine_that_refuses_the_connection_is_counted_by_its_node(
        self, rig: RigFactory
    ) -> None:
        endpoint = f"http://127.0.0.1:{_closed_port()}"
        gw = await rig(endpoint=endpoint)
        refused: list[str] = []
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        gw.replicas.routes[endpoint] = EngineRoute("node-7", "shard-1", "", lost, refused.append)
        status, _, _ = await gw.chat()
        assert status == 502
        assert gw.value("llmgw_upstream_errors_total", node="node-7", stage="connect") == 1
        labels = {
            "model": MODEL,
            "served_model": MODEL,
            "project": gw.project,
            "status": "5xx",
            "route": "chat",
        }
        assert gw.value("llmgw_requests_total", **labels, code="engine_unavailable") == 1


class TestAdmissionRefusals:
    async def test_refusals_are_counted_by_the_refusing_scopes_kind_and_the_reason(
        self, rig: RigFactory, store: Store
    ) -> None:
        gw = await rig()
        await set_limits(store, Scope("project", int(gw.project)), rpm=1, tpm=None)
        await gw.quotas.refresh(store)
        assert (await gw.chat())[0] == 200
        assert (await gw.chat())[0] == 429
        assert (await gw.chat({**BODY, "max_tokens": 10**6}))[0] == 400
        assert gw.value("llmgw_admission_refusals_total", scope="project", reason="requests") == 1
        assert gw.value("llmgw_admission_refusals_total", scope="model", reason="max_tokens") == 1


class TestBudgets:
    async def test_each_budget_and_what_its_period_spent_are_exported(
        self, rig: RigFactory, store: Store
    ) -> None:
        gw = await rig()
        await set_budget(store, Scope("project", int(gw.project)), 50.0, "day")
        await gw.quotas.refresh(store)
        assert (await gw.chat())[0] == 200
        registry = CollectorRegistry()
        registry.register(_Families(lambda: budget_families(gw.quotas)))
        labels = {"scope": "project", "id": gw.project, "period": "day"}
        assert registry.get_sample_value("llmgw_budget_amount", labels) == 50.0
        spent = registry.get_sample_value("llmgw_budget_spent", labels)
        assert spent is not None and spent == pytest.approx(gw.value("llmgw_cost_total", project=gw.project))
        assert spent > 0


class _Families:
    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        return self._read()


class TestRequestIds:
    async def test_the_clients_own_request_id_is_echoed(self, rig: RigFactory) -> None:
        gw = await rig()
        status, headers, _ = await gw.chat(**{"x-request-id": "trace-42"})
        assert status == 200
        assert headers["x-request-id"] == "trace-42"

    async def test_a_request_without_one_gets_a_fresh_id_each_time(self, rig: RigFactory) -> None:
        gw = await rig()
        ids = {(await gw.chat())[1]["x-request-id"] for _ in range(3)}
        assert len(ids) == 3
        assert all(len(i) == 24 for i in ids)

    async def test_a_refused_request_carries_its_id_too(self, rig: RigFactory) -> None:
        gw = await rig()
        status, headers, _ = await gw.chat(key="llmgw-not-a-key", **{"x-request-id": "refused-1"})
        assert status == 401
        assert headers["x-request-id"] == "refused-1"

    async def test_an_id_too_long_or_not_printable_ascii_is_replaced(self, rig: RigFactory) -> None:
        gw = await rig()
        for sent in ("x" * 129, "tab\tinside", "naïve-ünicode"):
            _, headers, _ = await gw.chat(**{"x-request-id": sent})
            assert headers["x-request-id"] != sent
            assert len(headers["x-request-id"]) == 24


class TestRequestLog:
    async def test_with_log_requests_each_request_logs_one_line_with_what_it_was(
        self, rig: RigFactory
    ) -> None:
        gw = await rig(log_requests=True)
        with capture_logs() as logs:
            status, _, _ = await gw.chat({**BODY, "stream": True}, **{"x-request-id": "abc"})
        assert status == 200
        lines = [e for e in logs if e["event"] == "request"]
        assert len(lines) == 1
        (line,) = lines
        assert line["request_id"] == "abc"
        assert line["key"] == gw.key[: len(line["key"])] and len(line["key"]) < len(gw.key)
        assert line["project"] == int(gw.project)
        assert (line["model"], line["served_model"], line["status"], line["route"]) == (
            MODEL,
            MODEL,
            200,
            "chat",
        )
        assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0
        assert 0 < line["ttfb_ms"] <= line["latency_ms"]
        # The key's secret never reaches the log.
        assert gw.key not in str(line)

    async def test_without_log_requests_no_request_is_logged(self, rig: RigFactory) -> None:
        gw = await rig()
        with capture_logs() as logs:
            assert (await gw.chat())[0] == 200
        assert [e for e in logs if e["event"] == "request"] == []
