"""The real machine behind init's seam: what it reads of itself, and how it asks for /health."""

from __future__ import annotations

import asyncio
import ipaddress

from aiohttp import web
from aiohttp.test_utils import unused_port

from llmgw.serverinit.system import HostSystem, is_global_unicast


async def test_the_addresses_it_reports_are_canonical_and_dialable_from_elsewhere() -> None:
    addresses = await asyncio.to_thread(HostSystem().addresses)
    for address in addresses:
        assert str(ipaddress.ip_address(address)) == address
        assert is_global_unicast(address)


async def test_health_is_true_only_for_a_200() -> None:
    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200 if request.query.get("ok") else 503)

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        machine = HostSystem()
        assert await machine.healthy(f"http://127.0.0.1:{port}/health?ok=1")
        assert not await machine.healthy(f"http://127.0.0.1:{port}/health")
    finally:
        await runner.cleanup()
    assert not await HostSystem().healthy(f"http://127.0.0.1:{unused_port()}/health")
