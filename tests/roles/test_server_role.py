"""The server role's own duties: reloading keys so a revocation bites within a second; reporting at start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest
from structlog.testing import capture_logs

from llmgw.config import AuthConfig, ControlConfig, ModelConfig, PriceConfig, ProfileConfig, ServerConfig
from llmgw.gateway.auth import KeyCache
from llmgw.gateway.errors import ApiError
from llmgw.roles import server as server_module
from llmgw.roles.server import server_role
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key, revoke_key
from llmgw.store.quotas import set_budget
from llmgw.store.scopes import Scope
from tests.servers import loopback_server_config


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "llmgw.db") as store:
        yield store


class TestKeyRefresh:
    async def test_the_refresh_loop_reloads_a_revocation_after_sleeping_under_a_second(
        self, store: Store
    ) -> None:
        plaintext, record = await create_key(store, "ci")
        keys = KeyCache()
        await keys.refresh(store)
        slept: list[float] = []
        reloaded = asyncio.Event()

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            if len(slept) == 1:
                # Revoked while the loop sleeps: the next wake must pick it up.
                await revoke_key(store, record.prefix)
                return
            reloaded.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(server_module._refresh_keys(store, keys, sleep))
        try:
            await reloaded.wait()
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # Half a second of sleep leaves the reload itself (one indexed SELECT) the other half.
        assert all(seconds <= 0.5 for seconds in slept)
        with pytest.raises(ApiError, match="was revoked on"):
            keys.authenticate(f"Bearer {plaintext}")


@pytest.fixture
def cfg(tmp_path: Path) -> ServerConfig:
    return loopback_server_config(
        tmp_path,
        auth=AuthConfig(enabled=True),
        control=ControlConfig(enabled=False),
        models=[],
    )


async def test_a_key_revoked_in_the_store_is_refused_by_a_running_server(cfg: ServerConfig) -> None:
    """The refresh loop is started by the role itself, not only by tests that call refresh()."""
    with capture_logs():
        async with server_role(cfg) as server, aiohttp.ClientSession() as session:
            key = await server.create_dev_key()
            headers = {"Authorization": f"Bearer {key}"}
            async with session.get(server.gateway_url + "/v1/models", headers=headers) as reply:
                assert reply.status == 200
            assert await revoke_key(server.store, key) is not None
            loop = asyncio.get_running_loop()
            # A generous deadline, not a timing claim: the test above proves the interval.
            deadline = loop.time() + 10
            while True:
                async with session.get(server.gateway_url + "/v1/models", headers=headers) as reply:
                    if reply.status == 401:
                        assert "was revoked" in (await reply.json())["error"]["message"]
                        break
                assert loop.time() < deadline, "the running server never noticed the revocation"
                await asyncio.sleep(0.05)


async def test_a_budget_no_price_applies_to_is_reported_when_the_server_starts(cfg: ServerConfig) -> None:
    cfg = attrs.evolve(
        cfg,
        models=[ModelConfig(name="priced", replicas=0), ModelConfig(name="free", replicas=0)],
        pricing={"priced": PriceConfig(prompt_per_1k=1.0)},
    )
    async with open_store(cfg.database_path) as store:
        await set_budget(store, Scope("org", 1), 10.0, "month")
    with capture_logs() as logs:
        async with server_role(cfg):
            pass
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert "budgets are set but no price applies to free: they never bind" in warnings
    assert not any("priced" in w for w in warnings)


class TestLeadership:
    async def test_a_server_on_sqlite_is_the_leader_and_says_so(self, cfg: ServerConfig) -> None:
        cfg = attrs.evolve(cfg, control=attrs.evolve(cfg.control, name="cp1"))
        with capture_logs():
            async with (
                server_role(cfg) as server,
                aiohttp.ClientSession() as session,
                session.get(server.admin_url + "/api/v1/status") as reply,
            ):
                plane = (await reply.json())["control_plane"]
        assert plane == {"name": "cp1", "role": "leader", "leader": "cp1", "leader_address": ""}

    async def test_two_servers_on_one_postgresql_say_which_leads_and_name_the_leader(
        self, tmp_path: Path, postgres_url: str
    ) -> None:
        configs = [
            await asyncio.to_thread(
                loopback_server_config,
                tmp_path / name,
                database=postgres_url,
                auth=AuthConfig(enabled=False),
                control=ControlConfig(name=name, advertise=f"198.18.0.{i}:7443"),
                models=[ModelConfig(name="sim-chat", profiles=[ProfileConfig(engine="sim")])],
            )
            for i, name in enumerate(("cp1", "cp2"), start=1)
        ]
        with capture_logs():
            async with (
                server_role(configs[0]) as first,
                server_role(configs[1]) as second,
                aiohttp.ClientSession() as session,
            ):

                async def plane(server: server_module.ServerHandle) -> dict[str, str]:
                    async with session.get(server.admin_url + "/api/v1/status") as reply:
                        said: dict[str, str] = (await reply.json())["control_plane"]
                        return said

                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while {(await plane(s))["role"] for s in (first, second)} != {"leader", "standby"} or not (
                    await plane(second)
                )["leader"]:
                    assert loop.time() < deadline, "no leader was elected"
                    await asyncio.sleep(0.05)
                roles = {(await plane(s))["name"]: await plane(s) for s in (first, second)}

                async def why(server: server_module.ServerHandle) -> str:
                    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}]}
                    async with session.post(server.gateway_url + "/v1/chat/completions", json=body) as reply:
                        assert reply.status == 503
                        said: str = (await reply.json())["error"]["message"]
                        return said

                # The standby answers as the leader does: it read the table the leader published,
                # which it can only have done through the LISTEN of its very first connection.
                while await why(first) != await why(second):
                    assert loop.time() < deadline + 10, "the standby never read the leader's table"
                    await asyncio.sleep(0.05)
                assert "no ready replica" in await why(second)
                # The standby's cluster page says where the nodes are to be seen.
                handles = {"cp1": first, "cp2": second}
                standing_by = next(n for n, p in roles.items() if p["role"] == "standby")
                async with session.get(handles[standing_by].admin_url + "/") as reply:
                    page = await reply.text()
                assert f"Control plane {standing_by}, standby; the leader is " in page
                # A roll of the agents asked of the standby is sent to the leader, which holds them.
                order = {"version": "0.2.0", "url": "/srv/llmgw-0.2.0-py3-none-any.whl", "sha256": "ab" * 32}
                async with session.post(
                    handles[standing_by].admin_url + "/api/v1/upgrades", json=order
                ) as reply:
                    assert reply.status == 409
                    refused = (await reply.json())["error"]
                assert refused.startswith("this control plane is a standby; the leader is ")
                assert refused.endswith(": run `llmgw ctl upgrade` against the leader")
        leader = next(p for p in roles.values() if p["role"] == "leader")
        standby = next(p for p in roles.values() if p["role"] == "standby")
        assert standby["leader"] == leader["name"] == leader["leader"]
        assert (
            standby["leader_address"] == {"cp1": "198.18.0.1:7443", "cp2": "198.18.0.2:7443"}[leader["name"]]
        )
