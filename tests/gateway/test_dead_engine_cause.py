"""A dead engine's 500, which names no cause, gets the cause the control plane has of its failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw.catalog import Catalog
from llmgw.config import AuthConfig, ModelConfig, ServerConfig
from llmgw.control import inventory as inventory_module
from llmgw.control.inventory import Inventory
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.proto.llmgw import v1 as pb

from ..waiting import eventually

MODEL = "tiny"
CHAT = "/v1/chat/completions"
HELLO = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
# What vLLM 0.32 answers once its engine core died, and what the agent reported of the last one.
DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
CAUSE = "vllm exited with code 0 after serving: Unsupported CPU attention configuration: head_dim=16"


class Engine:
    """An engine whose every reply is a 500 in OpenAI's shape, saying what the test puts in `says`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.says = DEAD


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    made: list[Engine] = []

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        error = {"message": made[0].says, "type": "InternalServerError", "code": 500}
        return web.json_response({"error": error}, status=500)

    app = web.Application()
    app.router.add_post(CHAT, chat)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        made.append(Engine(f"http://127.0.0.1:{server.port}"))
        yield made[0]
    finally:
        await server.close()


@pytest.fixture
def no_report_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway waits a moment, not CAUSE_WAIT_S, for a report that never comes."""
    monkeypatch.setattr(inventory_module, "CAUSE_WAIT_S", 0.05)


async def _ask(inventory: Inventory) -> tuple[int, str]:
    cfg = ServerConfig(models=[ModelConfig(name=MODEL)], auth=AuthConfig(enabled=False))
    client = TestClient(
        TestServer(make_gateway_app(cfg, Catalog(cfg), inventory, KeyCache()), host="127.0.0.1", port=0)
    )
    await client.start_server()
    try:
        resp = await client.post(CHAT, json=HELLO)
        return resp.status, (await resp.json())["error"]["message"]
    finally:
        await client.close()


def _fleet(endpoint: str, *, failed_before: bool) -> Inventory:
    inventory = Inventory(grace_s=15)
    inventory.attach(pb.Register(node_id="n1", engine_versions={"vllm": "0.32.0"}, engines_probed=True))
    if failed_before:
        inventory.shard_status(
            "n1", pb.ShardStatus(shard_id="s0", model=MODEL, engine="vllm", state="failed", detail=CAUSE)
        )
        inventory.shard_status("n1", pb.ShardStatus(shard_id="s0", model=MODEL, state="stopped"))
    ready = pb.ShardStatus(shard_id="s1", model=MODEL, engine="vllm", state="ready", endpoint=endpoint)
    inventory.shard_status("n1", ready)
    return inventory


async def test_a_dead_vllm_s_500_names_the_cause_its_last_replica_on_the_node_failed_of(
    engine: Engine, no_report_in_time: None
) -> None:
    """Its node reports nothing of this replica in time: an earlier one's failure there is named."""
    url = engine.url
    status, message = await _ask(_fleet(url, failed_before=True))
    assert status == 500
    assert message == f"{MODEL} on n1 failed: {DEAD} (the last replica of {MODEL} on n1 failed: {CAUSE})"


async def test_the_first_request_to_a_dying_engine_names_the_cause_its_node_reports_just_after(
    engine: Engine,
) -> None:
    """No replica failed before: the cause is the one the agent reads once the engine has exited."""
    inventory = _fleet(engine.url, failed_before=False)

    async def agent_reports_the_exit() -> None:
        # Once the gateway holds the engine's 500 and waits: the engine is still exiting when it
        # answers, and its agent reads its last words after.
        await eventually(lambda: "s1" in inventory._ending)
        failed = pb.ShardStatus(shard_id="s1", model=MODEL, engine="vllm", state="failed", detail=CAUSE)
        inventory.shard_status("n1", failed)

    (status, message), _ = await asyncio.gather(_ask(inventory), agent_reports_the_exit())
    assert status == 500
    assert message == f"{MODEL} on n1 failed: {DEAD} (its replica on n1 failed: {CAUSE})"


async def test_with_no_failure_known_the_engine_s_words_are_passed_on_alone(
    engine: Engine, no_report_in_time: None
) -> None:
    """Its node reports nothing in time (CAUSE_WAIT_S): the client is not kept waiting longer."""
    url = engine.url
    status, message = await _ask(_fleet(url, failed_before=False))
    assert (status, message) == (500, f"{MODEL} on n1 failed: {DEAD}")


async def test_an_engine_s_other_errors_are_not_blamed_on_an_old_failure(
    engine: Engine,
) -> None:
    url = engine.url
    engine.says = "the prompt is too long"
    status, message = await _ask(_fleet(url, failed_before=True))
    assert (status, message) == (500, f"{MODEL} on n1 failed: the prompt is too long")
