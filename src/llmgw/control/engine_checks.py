"""The gateway's own look at the engines of a node whose agent is unreachable (run by the server role).

While an agent is heard from, it says whether its engines serve (agent/probe.py).
Once it has been silent past `control.grace_s` its engines stay routed
(Inventory.expire): an agent stopped with `keep_engines_on_stop`, or cut off
from the control plane alone, leaves engines that still answer, and dropping
them answered 503 "unreachable" while they served. The gateway reaches those
engines directly and holds their secrets, so what it sees of them counts as
much as their node's word: every `control.engine_check_s` it asks each one's
health path, and one that does not answer 200 within as long leaves routing,
its requests in flight abandoned (Inventory.engine_gone). A request that fails
there takes it out as well (gateway/proxy.py).
"""

from __future__ import annotations

import asyncio

import aiohttp
import structlog
from aiohttp import hdrs

from llmgw.control.inventory import Inventory, Replica
from llmgw.engines.registry import ENGINES
from llmgw.routes import EngineRoute

log = structlog.get_logger(__name__)


class EngineChecks:
    """Checks every unattended engine each interval_s, until cancelled."""

    def __init__(self, inventory: Inventory, interval_s: float) -> None:
        self._inventory = inventory
        self._interval_s = interval_s

    async def run(self) -> None:
        # Its own small pool: a check must not wait behind the gateway's requests for a connection.
        timeout = aiohttp.ClientTimeout(total=self._interval_s)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            while True:
                await self.check(session)
                await asyncio.sleep(self._interval_s)

    async def check(self, session: aiohttp.ClientSession) -> None:
        """Ask each unattended engine once; take out those that do not answer."""
        unattended = self._inventory.unattended()
        if not unattended:
            return
        said = await asyncio.gather(*(self._ask(session, replica, route) for replica, route in unattended))
        for (replica, _), failure in zip(unattended, said, strict=True):
            if failure:
                log.warning(
                    "an engine whose node's agent is unreachable stopped answering the gateway",
                    model=replica.model,
                    node=replica.node_id,
                    shard=replica.shard_id,
                    reason=failure,
                )
                self._inventory.engine_gone(replica.shard_id, failure)

    async def _ask(self, session: aiohttp.ClientSession, replica: Replica, route: EngineRoute) -> str:
        """Empty when the engine answered 200; else what went wrong, in words."""
        engine = ENGINES.get(replica.engine)
        path = engine.health_path if engine is not None else "/health"
        headers = {hdrs.AUTHORIZATION: f"Bearer {route.secret}"} if route.secret else {}
        what = f"{replica.engine} on {replica.node_id}"
        try:
            async with session.get(replica.endpoint + path, headers=headers) as reply:
                if reply.status == 200:
                    return ""
                return f"{what} answered the gateway's {path} with {reply.status}"
        except TimeoutError:
            return f"{what} did not answer the gateway's {path} within {self._interval_s:g} s"
        except aiohttp.ClientError as exc:
            return f"{what} did not answer the gateway's {path}: {str(exc) or type(exc).__name__}"
