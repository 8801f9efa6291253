"""Two real servers sharing one PostgreSQL: a project's rpm holds across both gateways together."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from llmgw import bound, config
from llmgw.config import ModelConfig, ProfileConfig
from llmgw.control import tenancy
from llmgw.store.keys import create_key
from llmgw.store.postgres import open_postgres

from ..servers import loopback_server_config

pytestmark = pytest.mark.e2e

MODEL = "sim-chat"
START_S = 60.0


@contextlib.asynccontextmanager
async def _server(tmp_path: Path, database: str) -> AsyncIterator[str]:
    """`llmgw --role=server` in a process of its own on the shared store; its gateway's URL."""
    # Certificates made and files written in a thread: the loop serves the test's requests.
    cfg = await asyncio.to_thread(
        loopback_server_config,
        tmp_path,
        database=database,
        models=[ModelConfig(name=MODEL, profiles=[ProfileConfig(engine="sim")])],
    )
    path = tmp_path / "server.yaml"
    await asyncio.to_thread(path.write_text, await asyncio.to_thread(config.dump, cfg))
    log = await asyncio.to_thread((tmp_path / "server.log").open, "wb")
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "llmgw", "--role=server", "--config", str(path)), stdout=log, stderr=log
    )
    try:
        state = Path(cfg.state_dir)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_S
        while (listening := await asyncio.to_thread(bound.read, state)) is None:
            if process.returncode is not None or loop.time() > deadline:
                text = await asyncio.to_thread((tmp_path / "server.log").read_text)
                raise AssertionError(f"the server did not start:\n{text[-3000:]}")
            await asyncio.sleep(0.1)
        yield f"http://{listening.gateway}"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


async def test_200_requests_split_over_two_servers_gateways_at_rpm_60_admit_exactly_60(
    tmp_path: Path, postgres_url: str
) -> None:
    async with open_postgres(postgres_url) as store:
        plaintext, _ = await create_key(store, "shared")
        await tenancy.set_quota(store, "project:default", rpm=60)
    async with (
        _server(tmp_path / "a", postgres_url) as first,
        _server(tmp_path / "b", postgres_url) as second,
    ):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {plaintext}"}
        async with aiohttp.ClientSession() as session:

            async def chat(url: str) -> int:
                async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as reply:
                    await reply.read()
                    return reply.status

            statuses = Counter(await asyncio.gather(*(chat((first, second)[i % 2]) for i in range(200))))
    # No engine runs: an admitted request is answered 503 (no ready replica) by the router after
    # admission; a refused one 429.
    assert statuses == {503: 60, 429: 140}
