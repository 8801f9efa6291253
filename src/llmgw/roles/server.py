"""The server role: store, inventory, agent service, reconciler and gateway.

Built in dependency order and torn down in reverse by one exit stack: the
gateway stops taking requests first (in-flight ones finish within the drain
timeout), then the reconciler, the agent service and finally the store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import attrs
import structlog
from aiohttp import web

from llmgw.config import ServerConfig
from llmgw.control.agentsvc import serve_agents
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.roles.listen import split_host_port
from llmgw.store import Store, open_store
from llmgw.store.keys import create_key

log = structlog.get_logger(__name__)

# Revoking a key must take effect within a second.
_KEY_REFRESH_S = 0.5


@attrs.define
class ServerHandle:
    gateway_url: str
    agent_port: int
    store: Store
    keys: KeyCache
    inventory: Inventory

    async def create_dev_key(self) -> str:
        """A fresh key for the dev banner, usable at once."""
        plaintext, _ = await create_key(self.store, "dev")
        await self.keys.refresh(self.store)
        return plaintext


async def _refresh_keys(store: Store, keys: KeyCache) -> None:
    while True:
        await asyncio.sleep(_KEY_REFRESH_S)
        try:
            await keys.refresh(store)
        except Exception:
            log.exception("could not refresh the key cache; keeping the previous one")


@contextlib.asynccontextmanager
async def _serve_app(app: web.Application, address: str, key: str, drain_s: float) -> AsyncIterator[str]:
    host, port = split_host_port(address, key)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=drain_s)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def server_role(cfg: ServerConfig) -> AsyncIterator[ServerHandle]:
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(cfg.database_path))
        keys = KeyCache()
        await keys.refresh(store)
        inventory = Inventory(grace_s=cfg.control.grace_s)
        owned: list[asyncio.Task[None]] = []
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        # Registered after the group, so it runs before the group waits for them.
        stack.callback(_cancel_all, owned)
        owned.append(tasks.create_task(_refresh_keys(store, keys), name="key-cache-refresh"))
        agent_port = await stack.enter_async_context(serve_agents(cfg, inventory))
        if cfg.control.enabled:
            reconciler = Reconciler(cfg, inventory)
            owned.append(tasks.create_task(reconciler.run(), name="reconciler"))
        app = make_gateway_app(cfg, inventory, keys)
        url = await stack.enter_async_context(_serve_app(app, cfg.listen, "listen", cfg.drain_timeout_s))
        log.info("server ready", gateway=url, agent_port=agent_port, models=[m.name for m in cfg.models])
        yield ServerHandle(
            gateway_url=url, agent_port=agent_port, store=store, keys=keys, inventory=inventory
        )
        log.info("server stopping")


def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
