"""A replica's engine's metrics page, read by the control plane on demand through the admin API.

The engine is a real HTTP server on loopback answering what llama-server's
`--metrics` answers; the admin API reaches it at the replica's endpoint, as
the gateway does.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.engine_metrics import parse
from llmgw.catalog import Catalog
from llmgw.config import ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.proto.llmgw import v1 as pb

# What llama-server b11434 answers on /metrics, cut short.
LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 14
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 16
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """An engine's HTTP endpoint whose /metrics answers as llama-server's does."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=LLAMA_METRICS, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/")


def _replica(shard_id: str, state: str, endpoint: str) -> pb.ShardStatus:
    return pb.ShardStatus(shard_id=shard_id, model="tiny", engine="llamacpp", state=state, endpoint=endpoint)


@pytest.fixture
async def client(engine: str) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    inventory = Inventory(5.0, clock=lambda: 100.0)
    inventory.attach(
        pb.Register(
            node_id="n1",
            engine_versions={"llamacpp": "b11434"},
            engines_probed=True,
            running=[
                _replica("tiny-a", "ready", engine),
                _replica("tiny-b", "starting", ""),
                # Nothing listens there: the engine died since it last said it was ready.
                _replica("tiny-c", "ready", f"http://127.0.0.1:{_free_port()}"),
            ],
        ),
        "127.0.0.1:5000",
    )
    app = web.Application()
    adminapi.install(app, ServerConfig(), inventory, Catalog(ServerConfig()))
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_a_ready_replicas_engine_metrics_are_read_from_its_endpoint_as_numbers(
    client: TestClient, engine: str
) -> None:
    reply = await client.get("/api/v1/replicas/tiny-a/metrics")
    assert reply.status == 200
    body = await reply.json()
    assert (body["shard_id"], body["model"], body["node"], body["engine"]) == (
        "tiny-a",
        "tiny",
        "n1",
        "llamacpp",
    )
    assert body["url"] == f"{engine}/metrics"
    assert body["metrics"] == {
        "llamacpp:prompt_tokens_total": 14.0,
        "llamacpp:tokens_predicted_total": 16.0,
        "llamacpp:requests_processing": 1.0,
    }


async def test_a_replica_without_an_address_yet_is_refused_saying_so(client: TestClient) -> None:
    reply = await client.get("/api/v1/replicas/tiny-b/metrics")
    assert reply.status == 502
    assert (await reply.json())["error"] == (
        "replica tiny-b (llamacpp on n1) has no address yet (it is starting); "
        "its metrics come once it is ready"
    )


async def test_an_engine_that_does_not_answer_is_a_502_naming_it(client: TestClient) -> None:
    reply = await client.get("/api/v1/replicas/tiny-c/metrics")
    assert reply.status == 502
    error = (await reply.json())["error"]
    assert error.startswith("the engine of replica tiny-c (llamacpp on n1) at 127.0.0.1:")
    assert " did not answer on /metrics: " in error


async def test_an_unknown_replica_is_a_404(client: TestClient) -> None:
    reply = await client.get("/api/v1/replicas/nope/metrics")
    assert reply.status == 404
    assert (await reply.json())["error"] == "there is no replica nope; `llmgw ctl replicas` lists them"


def test_labelled_samples_keep_their_labels_in_the_name() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n'
    assert parse(text) == {'vllm:num_requests_running{model_name="m"}': 2.0}


async def test_an_engine_that_wants_its_replicas_secret_gets_it_on_the_metrics_read() -> None:
    seen: list[str] = []

    async def metrics(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer replica-secret":
            return web.Response(status=401)
        return web.Response(text=LLAMA_METRICS, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server:
        endpoint = str(server.make_url("")).rstrip("/")
        inventory = Inventory(5.0)
        status = _replica("tiny-a", "ready", endpoint)
        status.engine_secret = "replica-secret"
        inventory.attach(pb.Register(node_id="n1", running=[status]), "127.0.0.1:5000")
        admin = web.Application()
        adminapi.install(admin, ServerConfig(), inventory, Catalog(ServerConfig()))
        async with TestClient(TestServer(admin)) as client:
            reply = await client.get("/api/v1/replicas/tiny-a/metrics")
            assert reply.status == 200
            assert "replica-secret" not in await reply.text()
    assert seen == ["Bearer replica-secret"]
