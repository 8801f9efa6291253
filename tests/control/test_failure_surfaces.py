"""A replica that fails on a real node: its cause reaches the backoff, the 503, explain, the API and the logs.

The control plane (agent service, inventory, reconciler, admin API) runs in
this process; the node is a real agent client and supervisor dialling it over
mutual TLS, running the fake engine binary of tests/agent/test_failure_reasons.py,
which crashes at start printing what llama.cpp prints for a model it cannot load.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw import config
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.explain import explain_placement
from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.catalog import Catalog
from llmgw.config import AgentConfig, AuthConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache

from ..agent.test_failure_reasons import FAKE_ENGINE, FakeEngine

MODEL = "tiny"
CAUSE = "llamacpp exited with code 1: llama_model_load: error loading model: error: failed to load model"


@contextlib.asynccontextmanager
async def failing_node(fleet: Any, port: int, tmp_path: Path, mode: str) -> AsyncIterator[Supervisor]:
    """Node n1, whose llamacpp is the fake engine binary that crashes at start, or hangs."""
    binary = tmp_path / "llama-server"
    await asyncio.to_thread(binary.write_text, FAKE_ENGINE)
    engine = FakeEngine(binary, mode, tmp_path / "go", name="llamacpp")
    cfg = AgentConfig(
        node_id="n1",
        servers=[f"127.0.0.1:{port}"],
        state_dir=str(tmp_path / "agent"),
        tls=fleet.agents["n1"],
        heartbeat_interval_s=0.1,
    )
    async with (
        # A short health timeout, as agent.yaml's ready_timeout_s can set: the hanging engine's.
        Supervisor({"llamacpp": engine}, ready_timeout_s=0.5, state_dir=tmp_path / "agent") as supervisor,
        asyncio.TaskGroup() as tasks,
    ):
        client = AgentClient(cfg, supervisor, {"llamacpp": "b6500"}, backoff_base_s=0.05, backoff_max_s=0.2)
        task = tasks.create_task(client.run())
        try:
            yield supervisor
        finally:
            task.cancel()


@pytest.mark.parametrize(
    ("mode", "cause", "last_line"),
    [
        pytest.param("crash", CAUSE, "main: exiting due to model loading error", id="crashing"),
        pytest.param(
            "hang",
            "llamacpp did not answer /health within 0.5 s; its last line: loading model tensors",
            "loading model tensors",
            id="hanging",
        ),
    ],
)
async def test_a_replica_that_fails_says_why_beside_the_backoff_in_every_surface(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually, mode: str, cause: str, last_line: str
) -> None:
    model = ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="llamacpp")])
    # A long wait: the node stays backing off while the surfaces are read.
    cfg = config.evolve(
        server_cfg,
        auth=AuthConfig(enabled=False),
        models=[model],
        control=config.evolve(server_cfg.control, base_backoff_s=600),
    )
    inventory = Inventory(grace_s=cfg.control.grace_s)
    catalog = Catalog(cfg)
    reconciler = Reconciler(cfg, inventory, catalog, in_flight={})
    app = web.Application()
    adminapi.install(app, cfg, inventory, catalog)
    app[adminapi.BACKOFF_KEY] = reconciler.backoff
    gateway = make_gateway_app(cfg, catalog, inventory, KeyCache())
    async with (
        serve_agents(cfg, inventory) as port,
        asyncio.TaskGroup() as tasks,
        failing_node(fleet, port, tmp_path, mode),
        TestClient(TestServer(app)) as api,
        TestClient(TestServer(gateway)) as client,
    ):
        running = tasks.create_task(reconciler.run())
        try:
            backing_off = "node n1 is backing off after 1 failure (next try in "
            await eventually(lambda: backing_off in inventory.why_no_ready(MODEL), within_s=30)
            why = inventory.why_no_ready(MODEL)
            assert why.startswith(f"{MODEL} has no ready replica: no node can run it ({backing_off}"), why
            assert why.endswith(f" s): {cause})"), why
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
            refused = await client.post("/v1/chat/completions", json=chat)
            assert refused.status == 503
            message = (await refused.json())["error"]["message"]
            assert backing_off in message and message.endswith(f" s): {cause})"), message

            [candidate] = explain_placement(model, inventory, cfg, catalog.models(), reconciler.backoff())
            assert candidate.reason.startswith(
                "is backing off after 1 failure"
            ) and candidate.reason.endswith(cause)

            models = await (await api.get("/api/v1/models")).json()
            assert models[0]["why_not_ready"].endswith(f" s): {cause})")
            [failure] = models[0]["failures"]
            assert (failure["node"], failure["reason"]) == ("n1", cause)
            assert failure["last_output"][-1] == last_line

            explained = await (await api.get(f"/api/v1/explain-placement?model={MODEL}")).json()
            assert explained["candidates"][0]["reason"].endswith(cause)
            assert [f["reason"] for f in explained["failures"]] == [cause]

            # The failed replica was stopped and is gone from the replicas, but not from --all.
            assert await (await api.get("/api/v1/replicas")).json() == []
            [listed] = await (await api.get("/api/v1/replicas?all=1")).json()
            assert (listed["state"], listed["node"], listed["detail"]) == ("failed", "n1", cause)

            # And its output is still on its node, for `llmgw ctl logs n1 --source SHARD`.
            logs = await api.get(f"/api/v1/nodes/n1/logs?source={listed['shard_id']}&lines=1")
            assert logs.status == 200
            assert (await logs.json())["lines"] == [last_line]
        finally:
            running.cancel()


async def test_asking_for_all_replicas_with_a_word_that_is_not_yes_or_no_is_refused(
    server_cfg: ServerConfig,
) -> None:
    app = web.Application()
    adminapi.install(app, server_cfg, Inventory(5.0), Catalog(server_cfg))
    async with TestClient(TestServer(app)) as api:
        reply = await api.get("/api/v1/replicas?all=maybe")
        assert reply.status == 400
        assert "all is 'maybe'" in (await reply.json())["error"]
