"""Two real servers sharing one PostgreSQL: a project's rpm holds across both gateways together."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from llmgw.store.keys import create_key
from llmgw.store.postgres import open_postgres
from llmgw.tenancy import operations as tenancy

from .gateways import MODEL, Server, server_process

pytestmark = pytest.mark.e2e


async def _project(database: str, rpm: int) -> str:
    """A key on the default project, which is held to rpm; its plaintext."""
    async with open_postgres(database) as store:
        plaintext, _ = await create_key(store, "shared")
        await tenancy.set_quota(store, "project:default", rpm=rpm)
    return plaintext


async def _burst(servers: list[Server], key: str, count: int) -> Counter[int]:
    """count chat requests at once, split over the servers' gateways; the answers' statuses."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:

        async def chat(server: Server) -> int:
            async with session.post(f"{server.url}/v1/chat/completions", json=body, headers=headers) as reply:
                await reply.read()
                return reply.status

        return Counter(await asyncio.gather(*(chat(servers[i % len(servers)]) for i in range(count))))


# No engine runs: an admitted request is answered 503 (no ready replica) by the router, after
# admission; a refused one 429.
ADMITTED = 503


async def test_200_requests_split_over_two_servers_gateways_at_rpm_60_admit_exactly_60(
    tmp_path: Path, postgres_url: str
) -> None:
    key = await _project(postgres_url, rpm=60)
    async with (
        server_process(tmp_path / "a", postgres_url) as first,
        server_process(tmp_path / "b", postgres_url) as second,
    ):
        assert await _burst([first, second], key, 200) == {ADMITTED: 60, 429: 140}


async def test_a_server_stopped_gives_back_what_it_held_unused(tmp_path: Path, postgres_url: str) -> None:
    key = await _project(postgres_url, rpm=60)
    async with server_process(tmp_path / "b", postgres_url) as survivor:
        async with server_process(tmp_path / "a", postgres_url) as stopped:
            assert await _burst([stopped], key, 20) == {ADMITTED: 20}
        # Stopped (SIGTERM): it gave back all but the 20 still in the window.
        assert await _burst([survivor], key, 100) == {ADMITTED: 40, 429: 60}


async def test_a_server_killed_holding_a_lease_never_lets_the_other_past_the_limit(
    tmp_path: Path, postgres_url: str
) -> None:
    key = await _project(postgres_url, rpm=60)
    async with server_process(tmp_path / "b", postgres_url) as survivor:
        async with server_process(tmp_path / "a", postgres_url) as killed:
            assert await _burst([killed], key, 20) == {ADMITTED: 20}
            killed.process.send_signal(signal.SIGKILL)
            await killed.process.wait()
            # What it held, used or not, stays its own until its rows lapse: never more than 40 here.
            statuses = await _burst([survivor], key, 100)
        assert statuses[ADMITTED] <= 40
        assert statuses[ADMITTED] + statuses[429] == 100
