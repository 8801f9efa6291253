"""Two real servers sharing one PostgreSQL: a key made through one works through the other at once.

Each gateway reloads its keys every half second; a key its cache does not have yet is looked up in
the store before it is refused, so the first request with a new key is served wherever it goes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest

from .gateways import MODEL, Server, server_process

pytestmark = pytest.mark.e2e

# No engine runs: an admitted request is answered 503 (no ready replica) by the router, after
# authentication; an unknown key 401.
ADMITTED = 503


async def _llmgw(*args: str) -> str:
    """`llmgw ARGS`, as a person runs it: its stdout."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmgw", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def _status(server: Server, key: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as reply,
    ):
        await reply.read()
        return reply.status


async def test_a_key_created_with_one_servers_config_works_through_the_others_gateway_at_once(
    tmp_path: Path, postgres_url: str
) -> None:
    async with (
        server_process(tmp_path / "a", postgres_url),
        server_process(tmp_path / "b", postgres_url) as other,
    ):
        for name in ("first", "second", "third"):
            key = (
                await _llmgw("keys", "create", name, "--config", str(tmp_path / "a" / "server.yaml"))
            ).strip()
            # The very first request, before the other's next reload of its keys.
            assert await _status(other, key) == ADMITTED
        assert await _status(other, "sk-llmgw-" + "x" * 40) == 401
