"""Quotas and prices changed by a command or the admin API bind on a running server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from llmgw.cli.main import main
from llmgw.config import AuthConfig, ControlConfig, ServerConfig
from llmgw.gateway.quotas import Quotas
from llmgw.gateway.usage import UsageRecorder
from llmgw.roles import server as server_module
from llmgw.roles.server import server_role
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key
from llmgw.store.prices import set_price
from llmgw.tenancy import operations as tenancy
from tests.servers import loopback_server_config

BODY = {"model": "later", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
        auth=AuthConfig(enabled=True),
        control=ControlConfig(enabled=False),
        models=[],
    )


async def test_the_quota_refresh_loop_reloads_a_price_set_while_it_slept_a_second_at_most(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "llmgw.db") as store:
        quotas = Quotas(UsageRecorder())
        await quotas.refresh(store)
        slept: list[float] = []
        reloaded = asyncio.Event()

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            if len(slept) == 1:
                await set_price(store, "m", 1.0, 2.0)
                return
            reloaded.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(server_module._refresh_quotas(store, quotas, sleep))
        try:
            await reloaded.wait()
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert all(seconds <= 1.0 for seconds in slept)
        assert quotas.prices["m"].completion_per_1k == 2.0


async def _project_key(store: Store) -> str:
    await tenancy.create(store, "org", "acme")
    await tenancy.create(store, "team", "core", "acme")
    project = await tenancy.create(store, "project", "web", "core")
    plaintext, _ = await create_key(store, "ci", project_id=project.id)
    return plaintext


async def _refused(session: aiohttp.ClientSession, url: str, key: str, within_s: float = 10.0) -> str:
    """Ask until the gateway refuses with 429 (a generous deadline, not a timing claim); its message."""
    said: list[str] = []

    async def ask() -> bool:
        async with session.post(url, json=BODY, headers={"Authorization": f"Bearer {key}"}) as reply:
            if reply.status == 429:
                said.append((await reply.json())["error"]["message"])
                return True
            return False

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await ask():
        assert loop.time() < deadline, "the running server never applied the change"
        await asyncio.sleep(0.02)
    return said[0]


async def test_a_limit_set_with_llmgw_quotas_set_binds_on_a_running_server(
    cfg: ServerConfig, tmp_path: Path
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(f"state_dir: {cfg.state_dir}\n")
    with capture_logs():
        async with server_role(cfg) as server, aiohttp.ClientSession() as session:
            key = await _project_key(server.store)
            await server.keys.refresh(server.store)
            url = server.gateway_url + "/v1/chat/completions"
            headers = {"Authorization": f"Bearer {key}"}
            async with session.post(url, json=BODY, headers=headers) as reply:
                # Admitted (no limit), then refused by the router: no such model.
                assert reply.status == 404
            result = await asyncio.to_thread(
                CliRunner().invoke,
                main,
                ["quotas", "set", "project:web", "--rpm", "1", "--config", str(config)],
            )
            assert result.exit_code == 0, result.output
            message = await _refused(session, url, key)
    assert "rate limit reached for project 'web' (team 'core', org 'acme'): 1 requests per minute" in message


async def test_a_price_set_through_the_admin_api_binds_on_a_running_server(cfg: ServerConfig) -> None:
    with capture_logs():
        async with server_role(cfg) as server, aiohttp.ClientSession() as session:
            key = await _project_key(server.store)
            await server.keys.refresh(server.store)
            # A budget nothing has priced never binds: every request is free.
            await tenancy.set_quota(server.store, "project:web", budget=0.5, period="total")
            url = server.gateway_url + "/v1/chat/completions"
            async with session.post(url, json=BODY, headers={"Authorization": f"Bearer {key}"}) as reply:
                assert reply.status == 404
            price = {"prompt_per_1k": 100, "completion_per_1k": 100}
            async with session.put(server.admin_url + "/api/v1/prices/later", json=price) as reply:
                assert reply.status == 200
            message = await _refused(session, url, key)
    assert "the budget of project 'web' (team 'core', org 'acme') has too little left" in message
