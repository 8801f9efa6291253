"""Two real servers sharing one PostgreSQL: a project's rpm holds across both gateways together."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from llmgw.gateway.allowance import RENEW_S
from llmgw.store.keys import create_key
from llmgw.store.postgres import open_postgres
from llmgw.tenancy import operations as tenancy

from ..waiting import eventually, eventually_async
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


# The window the servers below count rpm over: short, so that the test sees it roll (see gateways.py).
SHORT_WINDOW_S = 6.0
_NOW = "extract(epoch FROM clock_timestamp())"


async def _rows_say(database: str) -> tuple[float, float]:
    """The store's clock now, and the second its lease rows say the first busy unit frees at."""
    connection = await asyncpg.connect(database)
    try:
        row = await connection.fetchrow(
            f"SELECT {_NOW}, min(frees_at) FILTER (WHERE units > 0 AND expires_at > {_NOW}) "
            "FROM allowance_leases WHERE kind = 'requests'"
        )
    finally:
        await connection.close()
    assert row is not None
    return float(row[0]), -1.0 if row[1] is None else float(row[1])


async def _refused(server: Server, key: str) -> int:
    """One chat request, refused at the limit: its Retry-After, which its message says too."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as reply,
    ):
        said = await reply.json()
        assert reply.status == 429, said
        seconds = int(reply.headers["Retry-After"])
    assert f"counted across every gateway; try again in {seconds} s" in said["error"]["message"]
    return seconds


async def test_a_refusal_at_the_limit_both_servers_hold_says_when_a_retry_is_first_admitted(
    tmp_path: Path, postgres_url: str
) -> None:
    key = await _project(postgres_url, rpm=10)
    loop = asyncio.get_running_loop()
    async with (
        server_process(tmp_path / "a", postgres_url, window_s=SHORT_WINDOW_S) as first,
        server_process(tmp_path / "b", postgres_url, window_s=SHORT_WINDOW_S) as second,
    ):
        assert await _burst([first, second], key, 10) == {ADMITTED: 10}

        async def told() -> bool:
            # Each server tells the store, once its lease is spent, when its first request leaves.
            now, frees_at = await _rows_say(postgres_url)
            return frees_at > now

        await eventually_async(told)
        refusals = [(server, loop.time(), await _refused(server, key)) for server in (first, second)]
        read_at = loop.time()
        now, frees_at = await _rows_say(postgres_url)
        for _, asked_at, retry_after in refusals:
            # Never sooner than the store says a unit frees; later by at most a renewal and rounding.
            assert retry_after >= frees_at - now
            assert retry_after <= frees_at - now + (read_at - asked_at) + RENEW_S + 1
        # Just before the window rolls, as the store's clock has it, nothing is admitted anywhere.
        await eventually_async(lambda: _store_passed(postgres_url, frees_at - 1.0), within_s=SHORT_WINDOW_S)
        early = await _burst([first, second], key, 2)
        answered, _ = await _rows_say(postgres_url)
        assert early == {429: 2} or answered >= frees_at
        # Once each refusal's Retry-After has passed, a retry through its server is admitted.
        for server, asked_at, retry_after in refusals:
            due = asked_at + retry_after
            await eventually(lambda due=due: loop.time() >= due, within_s=SHORT_WINDOW_S + RENEW_S + 2)
            assert await _burst([server], key, 1) == {ADMITTED: 1}


async def _store_passed(database: str, second: float) -> bool:
    now, _ = await _rows_say(database)
    return now >= second
