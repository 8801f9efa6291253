"""Two real servers sharing one PostgreSQL: each one's usage reaches the store whole, whatever happens.

Each server's usage journal has a mark of its own in the store; with one mark for all, a PostgreSQL
outage dropped the failed batch of the server with the lower numbers, and a server killed and started
again skipped its journal's records below the other server's numbers.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from llmgw.store.keys import create_key
from llmgw.store.postgres import open_postgres

from ..postgres import Cluster
from .gateways import MODEL, Server, server_process

pytestmark = pytest.mark.e2e

# Long enough for a writer that backs off (at most 15 s between tries) to write again.
WRITTEN_S = 90.0


async def _keys(database: str, count: int) -> list[tuple[int, str]]:
    """count new keys: (id, plaintext) each."""
    async with open_postgres(database) as store:
        made = [await create_key(store, f"k{i}") for i in range(count)]
    return [(key.id, plaintext) for plaintext, key in made]


async def _send(server: Server, key: str, count: int) -> int:
    """count chat requests one after another; how many the client received an answer to."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    answered = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(f"{server.url}/v1/chat/completions", json=body, headers=headers) as reply:
                await reply.read()
                answered += 1
    return answered


def _recorded(postgres: Cluster, database: str) -> Counter[int]:
    """Requests per key id, as the store has them."""
    rows = postgres.psql(
        "SELECT key_id, SUM(requests) FROM usage_daily GROUP BY key_id", database.rsplit("/", 1)[1]
    )
    return Counter({int(k): int(n) for k, n in (line.split("|") for line in rows.splitlines() if line)})


async def _until_recorded(postgres: Cluster, database: str, expected: Counter[int]) -> None:
    """Wait until the store has exactly expected; fail with what it has when the deadline passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITTEN_S
    while (found := await asyncio.to_thread(_recorded, postgres, database)) != expected:
        if loop.time() > deadline:
            raise AssertionError(f"the store has {dict(found)}; the clients received {dict(expected)}")
        await asyncio.sleep(0.2)


async def _log_lines(tmp_path: Path) -> list[dict[str, object]]:
    text = await asyncio.to_thread((tmp_path / "server.log").read_text)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def _until_said(tmp_path: Path, words: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITTEN_S
    while not any(words in str(line.get("event")) for line in await _log_lines(tmp_path)):
        if loop.time() > deadline:
            raise AssertionError(f"the server at {tmp_path} never said {words!r}")
        await asyncio.sleep(0.2)


async def _kill(server: Server) -> None:
    server.process.send_signal(signal.SIGKILL)
    await server.process.wait()


async def test_an_outage_loses_no_usage_of_either_server_each_with_its_own_key(
    tmp_path: Path, postgres: Cluster, postgres_url: str
) -> None:
    (first_id, first_key), (second_id, second_key) = await _keys(postgres_url, 2)
    async with (
        server_process(tmp_path / "a", postgres_url) as first,
        server_process(tmp_path / "b", postgres_url) as second,
    ):
        # The first server's journal numbers run ahead of the second's.
        served = Counter(
            {first_id: await _send(first, first_key, 20), second_id: await _send(second, second_key, 5)}
        )
        await _until_recorded(postgres, postgres_url, served)
        await asyncio.to_thread(postgres.stop, "immediate")
        try:
            served[first_id] += await _send(first, first_key, 10)
            served[second_id] += await _send(second, second_key, 10)
            for server in ("a", "b"):
                await _until_said(tmp_path / server, "could not write usage to the store")
        finally:
            await asyncio.to_thread(postgres.start)
        await _until_recorded(postgres, postgres_url, served)
        for server in ("a", "b"):
            await _until_said(tmp_path / server, "usage written to the store again")
        again = [
            line
            for server in ("a", "b")
            for line in await _log_lines(tmp_path / server)
            if line["event"] == "usage written to the store again"
        ]
        assert all(isinstance(line["requests"], int) for line in again), again


async def test_a_server_killed_mid_traffic_replays_its_usage_in_full_while_the_other_kept_writing(
    tmp_path: Path, postgres: Cluster, postgres_url: str
) -> None:
    (killed_id, killed_key), (other_id, other_key) = await _keys(postgres_url, 2)
    async with server_process(tmp_path / "b", postgres_url) as other:
        async with server_process(tmp_path / "a", postgres_url) as killed:
            served = Counter({killed_id: await _send(killed, killed_key, 20)})
            await _kill(killed)
        served[other_id] = await _send(other, other_key, 40)
        # The other server's records, numbered past the killed one's, written before the restart.
        await _until_other(postgres, postgres_url, other_id, 40)
        async with server_process(tmp_path / "a", postgres_url):
            await _until_recorded(postgres, postgres_url, served)
        replayed = [line for line in await _log_lines(tmp_path / "a") if "replayed_records" in line]
        assert replayed, "the restart said nothing of its replay"


async def _until_other(postgres: Cluster, database: str, key_id: int, requests: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITTEN_S
    while (await asyncio.to_thread(_recorded, postgres, database))[key_id] != requests:
        if loop.time() > deadline:
            raise AssertionError(f"key {key_id}'s {requests} requests never reached the store")
        await asyncio.sleep(0.2)


async def test_both_servers_killed_replay_their_usage_in_full(
    tmp_path: Path, postgres: Cluster, postgres_url: str
) -> None:
    (first_id, first_key), (second_id, second_key) = await _keys(postgres_url, 2)
    async with (
        server_process(tmp_path / "a", postgres_url) as first,
        server_process(tmp_path / "b", postgres_url) as second,
    ):
        served = Counter(
            {first_id: await _send(first, first_key, 20), second_id: await _send(second, second_key, 40)}
        )
        await asyncio.gather(_kill(first), _kill(second))
    # The one with the higher numbers first: with one mark for all, the other's replay then found
    # its records "written".
    async with server_process(tmp_path / "b", postgres_url), server_process(tmp_path / "a", postgres_url):
        await _until_recorded(postgres, postgres_url, served)
